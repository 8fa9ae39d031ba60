# Envoy with the Portcullis filter (a gateway replica), and the front Envoy
# that balances across the replicas: one image, two configs. ENVOY_BASE is
# Envoy's own image for users; the tests use a stand-in with the same
# layout (envoy at /usr/local/bin/envoy) made by scripts/container-images.sh.
ARG ENVOY_BASE=envoyproxy/envoy:v1.40.0
FROM ${ENVOY_BASE}
COPY portcullis_filter.wasm /etc/portcullis/portcullis_filter.wasm
# The native build, for an ECDS resource that names it (docs/native.md):
# either build serves from the same image.
COPY libportcullis.so /etc/portcullis/libportcullis.so
ENV ENVOY_DYNAMIC_MODULES_SEARCH_PATH=/etc/portcullis
# envoy-replica-control.yaml: the same replica, its filter config from the
# control plane over xDS (docker-compose.control.yml).
COPY envoy-replica.yaml envoy-replica-control.yaml envoy-front.yaml /etc/portcullis/
# The plugin config (an ECDS resource) comes in a mounted directory, so it
# can be replaced live; this one serves until then.
COPY ecds/portcullis.yaml /etc/portcullis/ecds/portcullis.yaml
COPY envoy-entrypoint.sh /usr/local/bin/portcullis-envoy
ENTRYPOINT ["/usr/local/bin/portcullis-envoy"]
# --drain-strategy immediate: on a drain every connection is told to close
# at once; --drain-time-s: how long listeners stay open while draining.
CMD ["-c", "/etc/portcullis/envoy-replica.yaml", "--concurrency", "2", "--disable-hot-restart", "--drain-strategy", "immediate", "--drain-time-s", "2"]
