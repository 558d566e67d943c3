package proto_test

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"os"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/sandkeep/sandkeep/internal/e2b/proto/filesystem"
	"github.com/sandkeep/sandkeep/internal/e2b/proto/process"
)

// TestDescriptorsMatchSDK compares our generated descriptors with the ones the e2b npm package embeds
// (testdata/sdk-2.51.0.desc: the base64 FileDescriptorProtos of its dist/index.js, one per line): every
// message, field (name, number, type, label, oneof, proto3 optional), enum value and method (streaming kind)
// must agree, or the SDK's JSON and binary encodings would not be ours.
func TestDescriptorsMatchSDK(t *testing.T) {
	sdk := readSDK(t, "testdata/sdk-2.51.0.desc")
	ours := map[string]protoreflect.FileDescriptor{
		"process/process.proto":       process.File_process_process_proto,
		"filesystem/filesystem.proto": filesystem.File_filesystem_filesystem_proto,
	}
	if len(sdk) != len(ours) {
		t.Fatalf("the SDK embeds %d files, we have %d", len(sdk), len(ours))
	}
	for name, fd := range sdk {
		o, ok := ours[name]
		if !ok {
			t.Fatalf("the SDK embeds %s, we do not", name)
		}
		want, got := shape(fd), shape(protodesc.ToFileDescriptorProto(o))
		if !slices.Equal(want, got) {
			for i := range max(len(want), len(got)) {
				w, g := at(want, i), at(got, i)
				if w != g {
					t.Errorf("%s line %d:\n sdk: %s\nours: %s", name, i, w, g)
					break
				}
			}
		}
	}
}

func readSDK(t *testing.T, path string) map[string]*descriptorpb.FileDescriptorProto {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]*descriptorpb.FileDescriptorProto{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b, err := base64.RawStdEncoding.DecodeString(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatal(err)
		}
		out[fd.GetName()] = fd
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(nothing)"
}

// shape flattens what the wire depends on into comparable lines. JSON names are left out: the SDK's descriptors
// carry none (both sides derive them from the field names).
func shape(fd *descriptorpb.FileDescriptorProto) []string {
	var out []string
	out = append(out, "package "+fd.GetPackage())
	var msg func(prefix string, m *descriptorpb.DescriptorProto)
	msg = func(prefix string, m *descriptorpb.DescriptorProto) {
		name := prefix + m.GetName()
		out = append(out, fmt.Sprintf("message %s map=%v", name, m.GetOptions().GetMapEntry()))
		for _, f := range m.GetField() {
			oneof := ""
			if f.OneofIndex != nil {
				oneof = m.GetOneofDecl()[f.GetOneofIndex()].GetName()
			}
			out = append(out, fmt.Sprintf("  %s=%d %s %s %s oneof=%s optional=%v", f.GetName(), f.GetNumber(),
				f.GetLabel(), f.GetType(), f.GetTypeName(), oneof, f.GetProto3Optional()))
		}
		for _, n := range m.GetNestedType() {
			msg(name+".", n)
		}
		for _, e := range m.GetEnumType() {
			enum(&out, name+"."+e.GetName(), e)
		}
	}
	for _, m := range fd.GetMessageType() {
		msg("", m)
	}
	for _, e := range fd.GetEnumType() {
		enum(&out, e.GetName(), e)
	}
	for _, s := range fd.GetService() {
		out = append(out, "service "+s.GetName())
		for _, m := range s.GetMethod() {
			out = append(out, fmt.Sprintf("  %s(%s client_stream=%v) %s server_stream=%v", m.GetName(), m.GetInputType(),
				m.GetClientStreaming(), m.GetOutputType(), m.GetServerStreaming()))
		}
	}
	return out
}

func enum(out *[]string, name string, e *descriptorpb.EnumDescriptorProto) {
	*out = append(*out, "enum "+name)
	for _, v := range e.GetValue() {
		*out = append(*out, fmt.Sprintf("  %s=%d", v.GetName(), v.GetNumber()))
	}
}
