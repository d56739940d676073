# Control plane image: API, reconciler and policy service (`autoscaler up`).
# Build from the repository root:
#   docker build -f agent_image/docker/control-plane.Dockerfile -t gpu-autoscaler:0.1.0 .
# Configuration comes from a mounted file and AUTOSCALER_* variables (docs/deploy.md);
# the database URL and admin token never go into the image.

FROM python:3.12-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY autoscaler ./autoscaler
COPY providers ./providers
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim-bookworm
# One venv owned by root, run as an unprivileged user: a compromise of the API cannot
# rewrite its own code.
COPY --from=build /wheels /wheels
RUN python -m venv /opt/autoscaler \
 && /opt/autoscaler/bin/pip install --no-cache-dir "$(ls /wheels/gpu_autoscaler-*.whl)[aws,gcp,azure]" \
 && rm -rf /wheels \
 && useradd --system --uid 10001 --home-dir /var/lib/autoscaler --create-home autoscaler
ENV PATH=/opt/autoscaler/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    AUTOSCALER_HOME=/var/lib/autoscaler \
    AUTOSCALER_CONFIG=/etc/autoscaler/autoscaler.yaml \
    AUTOSCALER_HOST=0.0.0.0 \
    AUTOSCALER_PORT=8080
USER autoscaler
WORKDIR /var/lib/autoscaler
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
# Listening on 0.0.0.0 is refused unless TLS ends in front (load balancer, proxy):
# the deployments in terraform/ always put one there.
ENTRYPOINT ["autoscaler"]
CMD ["up", "--tls-terminated-upstream"]
