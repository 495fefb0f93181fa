# Shaper control plane image (API, workers, beat, connectors share it).

# The dashboard's bundle, from the lock file, as `make web` builds it (web/frontend/).
FROM node:20-bookworm-slim AS dashboard
WORKDIR /build/web/frontend
COPY web/frontend/package.json web/frontend/package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY web/frontend ./
RUN npm run build

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /srv/shaper
COPY pyproject.toml README.md alembic.ini ./
COPY app app
COPY solver solver
COPY wire wire
COPY forecast forecast
COPY connectors connectors
COPY agent agent
COPY sim sim
COPY migrations migrations
COPY web web
COPY --from=dashboard /build/web/static/dist web/static/dist
RUN pip install --no-cache-dir .
RUN useradd --system --uid 10001 shaper
USER shaper
EXPOSE 8000
CMD ["shaper", "serve"]
