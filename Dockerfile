# AdTally server image: build with the Swift toolchain, run on slim Debian with libpq.
FROM swift:6.3-bookworm AS build
# The same build as `make build-release` (`make run`): the Makefile's target, its
# dependency script limited to what building needs (libpq, zlib, pkg-config).
# Hummingbird 2.28 needs swift-tools 6.2 or later; libpq and zlib are system-library targets.
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile Package.swift ./
COPY scripts ./scripts
COPY Sources ./Sources
COPY Tests ./Tests
# Package.swift names the kit (for the tests); the release build does not compile it.
COPY Clients/AdTallyKit ./Clients/AdTallyKit
RUN ADTALLY_DEPS=build make build-release SWIFT_BUILD_FLAGS=--static-swift-stdlib \
 && rm -rf /var/lib/apt/lists/* \
 && cp "$(swift build -c release --show-bin-path)/adtally" /usr/local/bin/adtally

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends libpq5 zlib1g ca-certificates tzdata curl \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/adtally adtally \
 && install -d -o adtally -g adtally /var/lib/adtally/exports
COPY --from=build /usr/local/bin/adtally /usr/local/bin/adtally
COPY Migrations /usr/share/adtally/migrations
# The server runs as the unprivileged adtally user, and writes exports only inside
# ADTALLY_EXPORTS_ROOT (mount a volume there to keep them).
ENV ADTALLY_MIGRATIONS_DIR=/usr/share/adtally/migrations \
    ADTALLY_EXPORTS_ROOT=/var/lib/adtally/exports \
    ADTALLY_HOST=0.0.0.0 \
    ADTALLY_PORT=8080
USER adtally
WORKDIR /var/lib/adtally
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD curl -fsS http://127.0.0.1:8080/readyz || exit 1
ENTRYPOINT ["/usr/local/bin/adtally"]
CMD ["serve"]
