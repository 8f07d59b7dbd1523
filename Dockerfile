# Tandem for NVIDIA GPUs. Build: docker build -t tandem:latest .   (see docs/deployment.md)
# Stage 1 builds the router (cargo, through maturin) and the locked Python environment with uv;
# stage 2 is the CUDA runtime with only that environment and its Python.
# The locked torch brings its own CUDA 13.2 libraries as wheels, which run on any driver of CUDA 13.0 (R580 or newer,
# minor version compatibility). The image's CUDA sets the driver the container runtime demands (NVIDIA_REQUIRE_CUDA),
# so it is a 13.0 release (13.0.2) rather than 13.2, which would demand a newer driver than the wheels need.
# launcher/tests/test_install_cuda_match.py keeps its CUDA major equal to the locked torch's.
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.2-runtime-ubuntu24.04
ARG PYTHON_VERSION=3.12

FROM rust:1-bookworm AS builder
ARG PYTHON_VERSION
COPY --from=ghcr.io/astral-sh/uv:latest /uv /usr/local/bin/uv
ENV UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/tandem \
    CARGO_TARGET_DIR=/build/target
RUN uv python install "${PYTHON_VERSION}"
WORKDIR /src
COPY . .
# --no-editable: the environment holds real copies of the workspace packages, so /src is not needed at run time.
RUN uv sync --locked --no-dev --no-editable --python "${PYTHON_VERSION}"

FROM ${CUDA_RUNTIME_IMAGE}
# Triton compiles a small C launcher for its kernels at their first launch, so the runtime needs a C compiler.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/python /opt/python
COPY --from=builder /opt/tandem /opt/tandem
ENV PATH=/opt/tandem/bin:${PATH} \
    HOME=/tmp \
    HF_HOME=/data/huggingface \
    PYTHONUNBUFFERED=1
RUN useradd --uid 1000 --user-group --no-create-home --home-dir /tmp tandem && mkdir -p /data && chown 1000:1000 /data
USER 1000:1000
EXPOSE 3000 9100
ENTRYPOINT ["tandem-launcher"]
CMD ["--hostname", "0.0.0.0", "--device", "cuda"]
