# dilu's image: the node manager and CLI (`dilu`), the cluster layer
# (`dilu-cluster`, `dilu-device-plugin`, `dilu-dra-plugin`), the interposer at
# /usr/local/lib/dilu/libdilu_interposer.so (where the Helm chart copies it
# from) and the simulated GPU (for `dilu run --sim` and `dilu demo`).
# Installed by scripts/install.sh, so it has a node's layout.
#
#   docker build -t dilu/dilu:0.1.0 .        (or: podman build, buildah bud)
#   docker run --rm dilu/dilu:0.1.0 dilu demo

# The Rust release CI builds and tests with (Cargo.toml's rust-version is the
# oldest the code declares, not one CI checks).
FROM docker.io/library/rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
# With the example /etc/dilu/nodemgr.toml (the chart mounts its own /etc/dilu).
RUN DESTDIR=/staging scripts/install.sh --no-unit

# Same Debian release as the build stage: the binaries need its glibc and
# libgcc_s, nothing else (TLS is rustls, the kubelet protocol compiled in).
FROM docker.io/library/debian:bookworm-slim
COPY --from=build /staging/ /
ENV DILU_LOG=info
EXPOSE 9400
CMD ["dilu", "--help"]
