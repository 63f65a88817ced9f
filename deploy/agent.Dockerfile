# The eBPF agent: the fathom image's binary as `fathom agent`, run as root
# (BPF and perf_event need privileges; see docs/deploy.md for the
# capabilities). Built on top of the fathom image so both share its layers:
#   bash scripts/images.sh   (builds fathom first, then this)
ARG FATHOM_IMAGE=fathom:latest
FROM ${FATHOM_IMAGE}
USER root
WORKDIR /
ENV FATHOM_AGENT_METRICS_LISTEN=0.0.0.0:7401
EXPOSE 7401
HEALTHCHECK --interval=5s --timeout=3s --start-period=5s CMD ["fathom-ready", "7401"]
ENTRYPOINT ["/usr/local/bin/fathom", "agent"]
CMD []
