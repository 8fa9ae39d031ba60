# One of our native services (portcullis-mock, portcullis-collector,
# portcullis-limiter, portcullis-control), built on the host and copied in: the image build adds
# seconds, not a second Rust build. BASE is any Debian bookworm root
# (debian:bookworm-slim for users; the tests' stand-in made by
# scripts/container-images.sh).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
ARG BIN
COPY ${BIN} /usr/local/bin/${BIN}
# The health checks speak HTTP through bash's /dev/tcp: no curl needed.
# /data: the collector's SQLite file (a named volume takes this owner).
RUN command -v bash >/dev/null && mkdir -p /data && chown 65534 /data
USER 65534
