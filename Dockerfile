# syntax=docker/dockerfile:1

# Build a static binary.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags="-s -w" -o /out/walcount ./cmd/walcount

# Run it on a minimal, non-root base image.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/walcount /walcount
USER nonroot:nonroot
EXPOSE 9750
ENTRYPOINT ["/walcount"]
CMD ["run"]
