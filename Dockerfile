# walcount's container image: a static binary, non-root, listening on
# 0.0.0.0:9750, with a HEALTHCHECK that runs the binary itself.
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
# BASE selects where the binary and the base come from:
#
#   distroless (default)  walcount is built in the golang image below and
#                         put on distroless static nonroot.
#   local                 nothing is pulled: the static binary and a small
#                         root filesystem (an /etc/passwd and /etc/group with
#                         the nonroot user, the CA certificates, /tmp) come
#                         from the build context's bin/image/, where
#                         `make image BASE=local` puts them, built and copied
#                         on the host. For machines that reach no image
#                         registry.
#
# BASE=local needs BuildKit, which skips the stages the target does not use
# (the default builder since Docker 23; the docker client of Debian's
# docker.io 20.10 with DOCKER_BUILDKIT=1, which make image sets). The legacy
# builder builds every stage, so it pulls both base images for either BASE.
#
# Base images are pinned by digest: a tag can be moved to another image, a
# digest cannot. The two digests below were NOT pulled or verified on the
# machine this was written on (it reaches no image registry): they are the
# ones several public Dockerfiles pin for these same tags. Check them before
# you rely on them, and when you update a base image:
#   docker buildx imagetools inspect golang:1.26.8-bookworm
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot
# go.mod's go directive needs Go 1.26.8, and the golang image sets
# GOTOOLCHAIN=local, so the builder must be at least that patch release.
ARG GO_IMAGE=golang:1.26.8-bookworm@sha256:dc9ad6c05acc7a88e5b71bde60a5fe3bd4b9f0db209011711b464107438a8107
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
ARG BASE=distroless

FROM ${GO_IMAGE} AS build-distroless
ARG VERSION=
ARG REVISION=
ARG MODIFIED=
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w -X github.com/walcount/walcount/internal/buildinfo.version=${VERSION} -X github.com/walcount/walcount/internal/buildinfo.revision=${REVISION} -X github.com/walcount/walcount/internal/buildinfo.modified=${MODIFIED}" -o /out/walcount ./cmd/walcount

# BASE=local: make image BASE=local builds bin/image/walcount with the same
# flags as above (CGO_ENABLED=0 GOOS=linux, -trimpath, -s -w, the version
# stamped) and assembles bin/image/rootfs and bin/image/nonroot-home
# (scripts/image-rootfs.sh).
FROM scratch AS build-local
COPY bin/image/walcount /out/walcount

FROM ${RUNTIME_IMAGE} AS runtime-distroless

FROM scratch AS runtime-local
COPY bin/image/rootfs/ /
COPY --chown=65532:65532 bin/image/nonroot-home /home/nonroot

FROM build-${BASE} AS build

FROM runtime-${BASE}
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
