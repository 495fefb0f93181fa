# Shaper control plane image (API, workers, beat, connectors share it).
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /srv/shaper
COPY pyproject.toml README.md alembic.ini ./
COPY app app
COPY solver solver
COPY wire wire
COPY connectors connectors
COPY agent agent
COPY sim sim
COPY migrations migrations
COPY web web
RUN pip install --no-cache-dir .
RUN useradd --system --uid 10001 shaper
USER shaper
EXPOSE 8000
CMD ["shaper", "serve"]
