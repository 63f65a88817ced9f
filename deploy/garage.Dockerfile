# Garage (a small S3 server) for the compose cluster and the container
# tests: one node, its bucket and key created at start by the entrypoint
# (deploy/docker/garage-entrypoint.sh). The garage binary comes from
# `cargo install garage --locked` on the host, staged by scripts/images.sh.
FROM debian:bookworm-slim
RUN mkdir -p /data && chown 10001:10001 /data
COPY deploy/docker/garage-entrypoint.sh /usr/local/bin/garage-entrypoint
COPY deploy/bin/garage /usr/local/bin/garage
USER 10001:10001
WORKDIR /data
VOLUME /data
# 3900: S3 API; 3903: admin API.
EXPOSE 3900 3903
HEALTHCHECK --interval=2s --timeout=3s --start-period=5s CMD ["garage-entrypoint", "ready"]
ENTRYPOINT ["/usr/local/bin/garage-entrypoint"]
