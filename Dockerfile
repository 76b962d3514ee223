# keygate: one image for every role (proxy sidecar, serve, app runtime, CLI).
# No `# syntax=` line: BuildKit would pull that frontend image, and the legacy builder ignores it.
# The base is the public Node 24 image; NODE_IMAGE overrides it (e.g. a mirror, or the local
# build of scripts/build-images.sh, which tags the same name where nothing can be pulled).
ARG NODE_IMAGE=node:24-bookworm-slim

# ---- build: compile TypeScript and the native SQLite addon ----------------------------------
FROM ${NODE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
# Dependencies first (cached layer); scripts off until the sources are there for `prepare`.
RUN npm ci --no-audit --no-fund --ignore-scripts && npm rebuild better-sqlite3
COPY tsconfig.json tsconfig.build.json ./
COPY scripts/build-validators.mjs ./scripts/
COPY src ./src
RUN npm run build && npm prune --omit=dev --no-audit --no-fund
# Both stages carry it (here last, so that it costs no cached layer): a machine that rebuilds often
# can remove its superseded, untagged images by this label.
LABEL org.opencontainers.image.title=keygate

# ---- runtime: slim, non-root ------------------------------------------------------------------
FROM ${NODE_IMAGE}
LABEL org.opencontainers.image.title=keygate
ENV NODE_ENV=production \
    KEYGATE_DATA_DIR=/data
WORKDIR /app
COPY --from=build /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
COPY package.json ./
COPY config ./config
COPY examples ./examples
RUN mkdir -p /data /certs && chown node:node /data /certs
USER node
# /data: database, master key, secrets; /certs: the proxy CA (key created 0600 on first run).
VOLUME ["/data", "/certs"]
STOPSIGNAL SIGTERM
EXPOSE 8080 3128
# V8 sized for a sidecar (bench/README.md): a young generation of 1 MiB per semi-space (V8 grows
# it to 16 under load) and an old generation that grows by 20 % between full collections (the
# small young generation promotes more): peak RSS under 32 busy connections ~76 instead of ~110
# MiB, idle under 60 MiB, CPU per small request the same within the benchmark's noise, about 10 %
# more CPU per GiB relayed. Heap settings can only be given when node starts, hence here.
ENTRYPOINT ["node", "--max-semi-space-size=2", "--heap-growing-percent=20", "/app/dist/cli/main.js"]
CMD ["serve", "--listen", "0.0.0.0:8080", "--data", "/data"]
