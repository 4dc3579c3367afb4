# walcount's container image: a static binary on distroless, non-root.
#
#   docker build -t walcount \
#     --build-arg VERSION=$(git describe --tags --always --dirty) \
#     --build-arg REVISION=$(git rev-parse HEAD) \
#     --build-arg MODIFIED=$(test -z "$(git status --porcelain)" && echo false || echo true) .
#
# (make image does this.) The build context has no .git (.dockerignore), so
# without the build arguments the image says `walcount dev (revision unknown,
# modified unknown, ...)`.
#
# Base images are pinned by digest: a tag can be moved to another image, a
# digest cannot. The two digests below were NOT pulled or verified on the
# machine this was written on (it has no Docker engine): they are the ones
# several public Dockerfiles pin for these same tags. Check them before you
# rely on them, and when you update a base image:
#   docker buildx imagetools inspect golang:1.26.8-bookworm
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot
# go.mod's go directive needs Go 1.26.8, and the golang image sets
# GOTOOLCHAIN=local, so the builder must be at least that patch release.
ARG GO_IMAGE=golang:1.26.8-bookworm@sha256:dc9ad6c05acc7a88e5b71bde60a5fe3bd4b9f0db209011711b464107438a8107
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab

FROM ${GO_IMAGE} AS build
ARG VERSION=
ARG REVISION=
ARG MODIFIED=
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X github.com/walcount/walcount/internal/buildinfo.version=${VERSION} -X github.com/walcount/walcount/internal/buildinfo.revision=${REVISION} -X github.com/walcount/walcount/internal/buildinfo.modified=${MODIFIED}" -o /out/walcount ./cmd/walcount

FROM ${RUNTIME_IMAGE}
ARG VERSION=
ARG REVISION=
LABEL org.opencontainers.image.title="walcount" \
      org.opencontainers.image.description="Keep counter-cache columns exact by following the PostgreSQL WAL" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/walcount /walcount
USER nonroot:nonroot
# Inside a container the API must listen beyond loopback, or a published
# port serves nothing. The variable wins over a config file's http_addr
# (a flag > variable > file > default); override it with -e. Set
# WALCOUNT_HTTP_TOKEN too: POST /v1/reconcile is then token-only.
ENV WALCOUNT_HTTP_ADDR=0.0.0.0:9750
EXPOSE 9750
# distroless has no shell or curl: the binary probes itself (GET /healthz
# on WALCOUNT_HTTP_ADDR, exit 0 or 1).
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 CMD ["/walcount", "healthcheck"]
ENTRYPOINT ["/walcount"]
CMD ["run"]
