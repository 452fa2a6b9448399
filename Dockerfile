# One image for every Trainyard service and the CLI:
#   python -m trainyard_<service>   (intake, validation, placement, launcher, status, gateway)
#   yard ...                        (the CLI)
# deploy/helm/trainyard runs it (docs/kubernetes.md). Built from the lock file, without
# the development dependencies; the services run as an unprivileged user.
FROM python:3.11-slim-bookworm AS build
RUN pip install --no-cache-dir uv==0.9.*
WORKDIR /src
COPY pyproject.toml uv.lock ./
COPY libs libs
COPY services services
ENV UV_PROJECT_ENVIRONMENT=/opt/trainyard UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy
RUN uv sync --frozen --no-dev --no-editable

FROM python:3.11-slim-bookworm
# git: the local backend's code sources; nothing else of the build stage comes along.
RUN apt-get update \
 && apt-get install -y --no-install-recommends git \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --home-dir /var/lib/trainyard --create-home trainyard
COPY --from=build /opt/trainyard /opt/trainyard
ENV PATH=/opt/trainyard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    YARD_DATA_DIR=/var/lib/trainyard
USER 10001
WORKDIR /var/lib/trainyard
EXPOSE 8080
CMD ["python", "-m", "trainyard_gateway"]
