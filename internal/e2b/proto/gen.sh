#!/bin/sh
# Regenerates the Go code of the envd protocol (go generate ./internal/e2b/proto). protoc comes from Debian's
# protobuf-compiler (3.21.12) and libprotobuf-dev (google/protobuf/timestamp.proto); the plugins are pinned here and installed into a cache directory, never committed.
set -eu
cd "$(dirname "$0")"
bin="${XDG_CACHE_HOME:-$HOME/.cache}/sandkeep-protoc-plugins"
GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOBIN="$bin" go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
PATH="$bin:$PATH" protoc -I . -I /usr/include \
	--go_out=. --go_opt=paths=source_relative \
	--connect-go_out=. --connect-go_opt=paths=source_relative \
	process/process.proto filesystem/filesystem.proto
