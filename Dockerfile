# AdTally server image: build with the Swift toolchain, run on slim Debian with libpq.
FROM swift:6.3-bookworm AS build
# Hummingbird 2.28 needs swift-tools 6.2 or later; libpq and zlib are system-library targets.
RUN apt-get update && apt-get install -y --no-install-recommends libpq-dev zlib1g-dev pkg-config && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Package.swift ./
COPY Sources ./Sources
COPY Tests ./Tests
RUN swift build -c release --product adtally --static-swift-stdlib \
 && cp "$(swift build -c release --show-bin-path)/adtally" /usr/local/bin/adtally

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpq5 zlib1g ca-certificates tzdata curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/adtally adtally
COPY --from=build /usr/local/bin/adtally /usr/local/bin/adtally
COPY Migrations /usr/share/adtally/migrations
ENV ADTALLY_MIGRATIONS_DIR=/usr/share/adtally/migrations \
    ADTALLY_HOST=0.0.0.0 \
    ADTALLY_PORT=8080
USER adtally
WORKDIR /var/lib/adtally
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["/usr/local/bin/adtally"]
CMD ["serve"]
