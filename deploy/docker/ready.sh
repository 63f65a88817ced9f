#!/bin/bash
# Exits 0 when GET http://127.0.0.1:PORT/ready answers HTTP 200 (the port
# defaults to 7400), 1 otherwise: a 503 "not ready" is not ready. Plain
# bash (/dev/tcp), so the images need no curl.
port=${1:-7400}
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
IFS=' ' read -r -t 3 _proto status _rest <&3 || exit 1
[ "$status" = 200 ]
