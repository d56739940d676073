# Agent image for container-based deployments (Kubernetes, ECS, a Docker host with GPUs).
# Build from the repository root:
#   docker build -f agent_image/docker/agent.Dockerfile -t gpu-autoscaler-agent:0.1.0 .
# Run with the GPUs and a bootstrap file mounted read-only:
#   docker run --gpus all -v /etc/autoscaler/agent.json:/etc/autoscaler/agent.json:ro gpu-autoscaler-agent:0.1.0
# The agent needs only httpx, pydantic and nvidia-ml-py; NVML comes from the host driver
# through the NVIDIA container runtime, so the image carries no driver.
# The agent runs as the unprivileged user `autoscaler`, so its tasks run as that user
# too (it cannot switch users) and can read what it can; with the bootstrap file
# mounted read-only it cannot remove the join token from it and says so in its log.
# See docs/agent.md, "Who runs tasks, and who can read what on a machine".

FROM python:3.12-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY autoscaler ./autoscaler
COPY providers ./providers
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim-bookworm
COPY --from=build /wheels /wheels
RUN python -m venv /opt/autoscaler-agent \
 && /opt/autoscaler-agent/bin/pip install --no-cache-dir "$(ls /wheels/gpu_autoscaler-*.whl)[gpu]" \
 && rm -rf /wheels \
 && useradd --system --uid 10001 --home-dir /var/lib/autoscaler-agent --create-home autoscaler
ENV PATH=/opt/autoscaler-agent/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER autoscaler
WORKDIR /var/lib/autoscaler-agent
# The agent has no listening port; its heartbeat to the control plane is its health.
HEALTHCHECK NONE
ENTRYPOINT ["autoscaler", "agent"]
CMD ["--bootstrap", "/etc/autoscaler/agent.json"]
