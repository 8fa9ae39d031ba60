# Redis for limits scoped `global`: Debian's redis-server. The tests' stand-in
# base already carries it; on debian:bookworm-slim it is installed here.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN command -v redis-server >/dev/null || \
    (apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*)
USER 65534
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]
