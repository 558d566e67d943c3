// Package proto holds the envd wire of the E2B front: process/process.proto and filesystem/filesystem.proto,
// decoded from the e2b npm package's embedded descriptors, and the Go generated from them (protoc-gen-go,
// protoc-gen-connect-go; versions pinned in gen.sh). The generated code is committed.
package proto

//go:generate sh gen.sh
