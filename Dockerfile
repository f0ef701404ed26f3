# syntax=docker/dockerfile:1
#
# device-numa-extender image.
#   docker build -t device-numa-extender:0.1.0 .
#
# The builder runs exactly what CI proves (`cargo build --release --locked`), so an image build
# never resolves a dependency set that CI has not tested.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# rust:*-slim ships gcc and libc6-dev, which is all `ring` (rustls) needs: no OpenSSL, no pkg-config.
COPY . .
# Cache mounts keep the registry and target dir between builds on one builder; the binary is
# copied out of the cached target dir because cache mounts are not part of the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin device-numa-extender \
 && install -D -m 0755 target/release/device-numa-extender /out/device-numa-extender

# cc = glibc + libgcc_s, which a Rust binary linked against glibc needs; no shell, no package
# manager. The :nonroot variant runs as UID/GID 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/device-numa-extender /device-numa-extender
# Numeric user so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
# The binary writes nothing to disk: it runs with readOnlyRootFilesystem (TLS files, when used,
# come from a read-only Secret volume). 8888: verbs (--listen); 8889: probes and metrics, when
# started with --probe-address 0.0.0.0:8889 as the chart does.
EXPOSE 8888 8889
ENTRYPOINT ["/device-numa-extender"]
CMD ["serve"]
