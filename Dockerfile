# kv-indexer in a container.
#   docker build -t kv-indexer .
#   docker run --rm -p 8090:8090 kv-indexer --port 8090 --block-size 16 \
#       --model-name llama-3-8b --workers 1=tcp://10.0.0.5:5557
# Flags as in `kv-indexer --help`; KV_INDEXER_ADMIN_TOKEN and the other
# KV_INDEXER_* variables work as environment (docker run -e).

# Build: current stable Rust on Debian 12 (the runtime's glibc), with the
# C/C++ compiler the vendored libzmq needs.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Links libzmq's C++ runtime in (see the file).
COPY .cargo .cargo
COPY src src
# Cargo.toml declares the benchmarks; the manifest needs their files.
COPY benches benches
RUN cargo build --release --locked --bin kv-indexer

# Run: the binary alone, on glibc and libgcc, as an unprivileged user.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/kv-indexer /usr/local/bin/kv-indexer
EXPOSE 8090
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kv-indexer"]
CMD ["--port", "8090"]
