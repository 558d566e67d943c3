package build

import (
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/internal/fault"
)

func TestCheckDockerfile(t *testing.T) {
	for _, tc := range []struct {
		name, df string
		refused  string // a part of the message; "" means accepted
	}{
		{"plain", "FROM x\nCOPY . /src\nRUN make\n", ""},
		{"add local", "FROM x\nADD app.tar.gz /opt/\n", ""},
		{"add local json", "FROM x\nADD [\"a b\", \"/c\"]\n", ""},
		{"run network none", "FROM x\nRUN --network=none make\n", ""},
		{"add http", "FROM x\nADD http://127.0.0.1:8080/x /x\n", "ADD http://127.0.0.1:8080/x"},
		{"add https json", "FROM x\nADD [\"https://example.com/a\", \"/a\"]\n", "ADD https://example.com/a"},
		{"add upper scheme", "FROM x\nadd HTTP://h/x /x\n", "ADD HTTP://h/x"},
		{"add git", "FROM x\nADD git@github.com:o/r.git /r\n", "git@github.com"},
		{"add second source", "FROM x\nADD a.txt http://h/y /dst/\n", "http://h/y"},
		{"add variable", "FROM x\nARG U=http://h/x\nADD $U /x\n", "not literal"},
		{"add braces", "FROM x\nADD ${U} /x\n", "not literal"},
		{"add continued", "FROM x\nADD \\\n  http://h/x \\\n  /x\n", "Dockerfile:2"},
		{"add with chown", "FROM x\nADD --chown=1:1 http://h/x /x\n", "http://h/x"},
		{"onbuild add", "FROM x\nONBUILD ADD http://h/x /x\n", "(ONBUILD)"},
		{"run network host", "FROM x\nRUN --network=host curl h\n", "RUN --network=host"},
		{"run network default", "FROM x\nRUN --network=default true\n", "--network=default"},
		{"escape directive", "# escape=`\nFROM x\nADD http://h/x `\n  /x\n", "http://h/x"},
		{"does not parse", "FROM x\nRUN <<EOF\n", "does not parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckDockerfile("Dockerfile", []byte(tc.df))
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !fault.Is(err, CodeContextInvalid) || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("err = %v, want %s mentioning %q", err, CodeContextInvalid, tc.refused)
			}
		})
	}
}

// FuzzCheckDockerfile: any input is accepted or refused with CodeContextInvalid, never a panic or another error,
// and an ADD of a URL that parses is always refused.
func FuzzCheckDockerfile(f *testing.F) {
	for _, s := range []string{"FROM x\nADD http://h/x /x\n", "FROM x\nRUN --network=host a\n", "FROM x\nONBUILD ADD a b\n", "# escape=`\nFROM x\n"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, df string) {
		if err := CheckDockerfile("Dockerfile", []byte(df)); err != nil && !fault.Is(err, CodeContextInvalid) {
			t.Fatalf("error of another kind: %v", err)
		}
		if err := CheckDockerfile("Dockerfile", []byte("FROM x\nADD http://"+strings.Map(func(r rune) rune {
			if r <= ' ' || r == '\\' || r == '$' || r == '[' {
				return 'a'
			}
			return r
		}, df)+" /x\n")); err == nil {
			t.Fatal("an ADD of a URL was accepted")
		}
	})
}
