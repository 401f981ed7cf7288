# syntax=docker/dockerfile:1
# Strata in a container. Needs BuildKit (the default builder since Docker 23): it builds
# only the runtime stage that VARIANT selects, and caches cargo's downloads and target/.
#
#   docker build -t strata:cpu .
#   docker build -t strata:cuda --build-arg VARIANT=cuda .
#   docker run -d -p 8000:8000 -v strata-home:/var/lib/strata strata:cpu
#   docker run -d -p 8000:8000 -v strata-home:/var/lib/strata --gpus all strata:cuda
#
# The cuda image holds the same binary as the cpu one. Strata has no GPU backend yet, so
# today it runs on the CPU in either image; the GPU backend will load libcuda at run time,
# which the NVIDIA container toolkit mounts into the cuda image. See deploy/README.md.

# cpu: debian:bookworm-slim; cuda: nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04.
ARG VARIANT=cpu
ARG RUST_VERSION=1.95
ARG CUDA_VERSION=12.8.1

# One build for both variants. The binary needs the glibc of the build stage or newer:
# bookworm has glibc 2.36, both runtime bases have at least that (bookworm-slim 2.36,
# Ubuntu 24.04 2.39). Ubuntu 22.04 (glibc 2.35) would not be safe. The runtime stage
# runs `strata --version`, so a base that cannot run the binary fails the build.
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Only what `cargo build` reads (.dockerignore keeps the rest out of the context). The
# crate has no system-library dependencies: TLS is rustls with bundled roots, and the
# oniguruma regex library behind tokenizers is compiled from source with gcc.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY kernels ./kernels
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked \
    && cp target/release/strata /usr/local/bin/strata

FROM debian:bookworm-slim AS runtime-cpu

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04 AS runtime-cuda

FROM runtime-${VARIANT}
# ca-certificates for HTTPS from tools in the image (Strata itself carries its roots);
# curl for the HEALTHCHECK below: Strata has no health subcommand, and curl also makes
# `docker exec ... curl localhost:8000/api/ps` work. bash's /dev/tcp would save the
# package but makes a probe that is harder to read and to get right.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 strata \
    && useradd --uid 10001 --gid strata --home-dir /var/lib/strata --no-create-home --no-log-init \
        --shell /usr/sbin/nologin strata \
    && install -d -o strata -g strata -m 0750 /var/lib/strata \
    && install -d -m 0755 /etc/strata
COPY --from=build /usr/local/bin/strata /usr/local/bin/strata
RUN ["strata", "--version"]

# The model store and PID file; /etc/strata/strata.toml, if mounted, is the config file.
ENV STRATA_HOME=/var/lib/strata \
    STRATA_HOST=0.0.0.0
# Created above owned by strata, so a new named volume starts owned by strata too.
VOLUME /var/lib/strata
# Numeric, so that Kubernetes can check runAsNonRoot. A fixed UID/GID, not 1000 (the cuda
# base already has `ubuntu` there), that volumes and deploy/k8s/deployment.yaml's
# runAsUser/fsGroup name.
USER 10001:10001
EXPOSE 8000
# /health is 503 while the startup model loads and 200 after; it needs no API key. The
# start period covers loading a large model.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10m --retries=3 \
    CMD curl -fsS -o /dev/null "http://127.0.0.1:${STRATA_PORT:-8000}/health" || exit 1
# SIGTERM (docker stop) drains requests for grace-period (default 10s): give `docker
# stop` more than that (-t 30; compose's stop_grace_period).
STOPSIGNAL SIGTERM
ENTRYPOINT ["strata"]
CMD ["serve"]
