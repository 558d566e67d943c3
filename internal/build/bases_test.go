package build

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestBases: the images a Dockerfile makes the engine pull when absent are every FROM that is not an earlier
// stage or scratch and every COPY --from that is not a stage, FROM expanded with the global ARGs (the build's
// args overriding their defaults, as the builder does); what could name an image this check does not see is
// refused.
func TestBases(t *testing.T) {
	for _, tc := range []struct {
		name, df string
		args     map[string]string
		want     []string
		refused  string // a part of the message; "" means accepted
	}{
		{name: "one", df: "FROM alpine:3\nRUN true\n", want: []string{"alpine:3"}},
		{name: "scratch", df: "FROM scratch\nCOPY a /a\n", want: nil},
		{name: "registry", df: "FROM 127.0.0.1:5000/team/base@sha256:" + strings.Repeat("a", 64) + "\n", want: []string{"127.0.0.1:5000/team/base@sha256:" + strings.Repeat("a", 64)}},
		{name: "stages", df: "FROM golang:1 AS Build\nRUN go build\nFROM build AS test\nFROM scratch\nCOPY --from=build /x /x\nCOPY --from=0 /y /y\nCOPY --from=TEST /z /z\n", want: []string{"golang:1"}},
		{name: "copy from image", df: "FROM scratch\nCOPY --from=busybox:1 /bin/sh /sh\nCOPY --from=7 /a /a\n", want: []string{"busybox:1", "7"}},
		{name: "platform flag", df: "FROM --platform=linux/amd64 debian:12 AS base\n", want: []string{"debian:12"}},
		{name: "global arg default", df: "ARG BASE=ghcr.io/o/img:1\nFROM $BASE\n", want: []string{"ghcr.io/o/img:1"}},
		{name: "global arg overridden", df: "ARG BASE=ghcr.io/o/img:1\nFROM ${BASE}\n", args: map[string]string{"BASE": "evil.example/x:1"}, want: []string{"evil.example/x:1"}},
		{name: "undeclared arg ignored", df: "FROM ${BASE:-alpine}\n", args: map[string]string{"BASE": "evil.example/x"}, want: []string{"alpine"}},
		{name: "stage arg does not reach FROM", df: "ARG V=1\nFROM a:$V\nARG V=2\nFROM b:$V\n", want: []string{"a:1", "b:1"}},
		{name: "arg from arg", df: "ARG R=r.example\nARG IMG=$R/x\nFROM $IMG\n", want: []string{"r.example/x"}},
		{name: "once each", df: "FROM a\nFROM a\nFROM scratch\nCOPY --from=a /x /x\n", want: []string{"a"}},
		{name: "escape directive", df: "# escape=`\nARG B=x`\ny\nFROM $B\n", want: []string{"xy"}},
		{name: "empty expansion", df: "FROM $NOPE\n", refused: "expands to no image"},
		{name: "copy from variable", df: "FROM scratch\nCOPY --from=$IMG /a /a\n", refused: "not literal"},
		{name: "does not parse", df: "FROM x\nRUN <<EOF\n", refused: "does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Bases("Dockerfile", []byte(tc.df), tc.args)
			if tc.refused != "" {
				if !fault.Is(err, CodeContextInvalid) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("err = %v, want %s mentioning %q", err, CodeContextInvalid, tc.refused)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Bases = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestContextChecksBases: Context calls Request.Base with each base image before it writes anything, and a
// refusal stops the build with that error.
func TestContextChecksBases(t *testing.T) {
	root := repo(t, map[string]string{"Dockerfile": "FROM 127.0.0.1:5000/base:1 AS b\nFROM scratch\nCOPY --from=b /x /x\nCOPY --from=other:2 /y /y\n"})
	var asked []string
	refusal := errors.New("refused")
	_, _, _, err := Context(t.Context(), Request{Root: root, Base: func(_ context.Context, ref string) error {
		asked = append(asked, ref)
		if ref == "other:2" {
			return refusal
		}
		return nil
	}})
	if !errors.Is(err, refusal) || !slices.Equal(asked, []string{"127.0.0.1:5000/base:1", "other:2"}) {
		t.Fatalf("err = %v, asked %q", err, asked)
	}
	tarball, _, _, err := Context(t.Context(), Request{Root: root, Base: func(context.Context, string) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	tarball.Close()
}

// FuzzBases: any Dockerfile gives base images or CodeContextInvalid, never a panic or another error, and never
// an empty name.
func FuzzBases(f *testing.F) {
	for _, s := range []string{"FROM a AS b\nCOPY --from=b /x /x\n", "ARG B=x\nFROM $B\n", "# escape=`\nFROM ${X:-y}\n", "FROM scratch\nCOPY --from=1 a b\n"} {
		f.Add(s, "B", "v")
	}
	f.Fuzz(func(t *testing.T, df, k, v string) {
		bases, err := Bases("Dockerfile", []byte(df), map[string]string{k: v})
		if err != nil && !fault.Is(err, CodeContextInvalid) {
			t.Fatalf("error of another kind: %v", err)
		}
		for _, b := range bases {
			if b == "" {
				t.Fatalf("an empty base from %q", df)
			}
		}
	})
}
