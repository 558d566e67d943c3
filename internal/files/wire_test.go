package files

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// TestViaAgent runs this package's whole suite a second time with every operation through the wire of
// `sandkeep-agent fs` (OpenRemote's FS, Serve in-process): the semantics, limits and faults of the file API on
// the kubernetes driver are those of the host's, test for test.
func TestViaAgent(t *testing.T) {
	if viaAgent {
		t.Skip("this is the run through the agent")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	args := []string{"-test.run", ".", "-test.skip", "^(TestViaAgent|Fuzz.*)$", "-test.count", "1"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SANDKEEP_FILES_VIA_AGENT=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("PASS")) {
		t.Fatalf("the suite through the agent: %v\n%s", err, out)
	}
}

func TestParseOp(t *testing.T) {
	good := []string{
		`{"op":"stat","path":".","limits":{}}`,
		`{"op":"write","path":"a/b","mode":420,"limits":{"MaxFileBytes":10}}`,
		`{"op":"tar","path":"x","limits":{"MaxFileBytes":1,"MaxTarBytes":2,"MaxTarEntries":3}}`,
	}
	for _, s := range good {
		if _, err := ParseOp(s); err != nil {
			t.Errorf("ParseOp(%s): %v", s, err)
		}
	}
	bad := []string{
		``, `{}`, `[]`, `{"op":"rm","path":".","limits":{}}`,
		`{"op":"stat","path":"../x","limits":{}}`,
		`{"op":"stat","path":"/workspace/x","limits":{}}`, // the host sends clean relative paths only
		`{"op":"stat","path":"a//b","limits":{}}`,
		`{"op":"stat","path":"","limits":{}}`,
		`{"op":"stat","path":".","limits":{},"extra":1}`,
		`{"op":"stat","path":".","limits":{}} {}`,
		`{"op":"write","path":"a","mode":2048,"limits":{}}`,
		`{"op":"read","path":"a","mode":420,"limits":{}}`,
		`{"op":"read","path":"a","limits":{"MaxFileBytes":-1}}`,
		`{"op":"read","path":"a\u0000b","limits":{}}`,
		`{"op":"read","path":"` + strings.Repeat("a/", 5000) + `","limits":{}}`,
	}
	for _, s := range bad {
		if op, err := ParseOp(s); err == nil {
			t.Errorf("ParseOp(%.80s) accepted: %+v", s, op)
		}
	}
}

func TestParseReply(t *testing.T) {
	err := ParseReply([]byte(`{"code":"FILE_NOT_FOUND","message":"/workspace/x does not exist","hint":"check"}`+"\n"), "/workspace/x")
	if fe := new(fault.Error); !errors.As(err, &fe) || fe.Code != fault.FileNotFound || fe.Message != "/workspace/x does not exist" || fe.Hint != "check" {
		t.Errorf("a file fault: %#v", err)
	}
	// A code that is not a file fault's is not believed: a sandbox could forge any.
	for _, s := range []string{`{"code":"UNAUTHORIZED","message":"m"}`, `{"code":"FILE_NOT_FOUND"}`, `garbage`, `{"message":"m","x":1}`, ``} {
		err := ParseReply([]byte(s), "/workspace/x")
		if !errors.Is(err, ErrAgent) || fault.CodeOf(err) != "" {
			t.Errorf("ParseReply(%q) = %v, want an ErrAgent without a code", s, err)
		}
	}
	var re *ReadError
	if err := ParseReply([]byte(`{"message":"cut","read_error":true}`), "/workspace/f"); !errors.As(err, &re) || re.Path != "/workspace/f" {
		t.Errorf("a read error: %#v", err)
	}
	// Text from the sandbox is one printable line.
	err = ParseReply([]byte(`{"code":"FILE_TYPE","message":"a\u001b[31mb\nc"}`), "")
	if fe := new(fault.Error); !errors.As(err, &fe) || fe.Message != "a[31mbc" {
		t.Errorf("control characters kept: %#v", err)
	}
}

func TestChunks(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 10000)
	var stopped bool
	enc := newChunkEncoder(iotest.OneByteReader(bytes.NewReader(data)), func() bool { return stopped })
	wire, err := io.ReadAll(enc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(NewChunkReader(iotest.HalfReader(bytes.NewReader(wire))))
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("round trip: %d bytes, %v", len(got), err)
	}
	// Cut anywhere before the end marker: never a clean end.
	for _, cut := range []int{0, 1, 4, 5, len(wire) - 4, len(wire) - 1} {
		_, err := io.ReadAll(NewChunkReader(bytes.NewReader(wire[:cut])))
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("cut at %d: %v, want io.ErrUnexpectedEOF", cut, err)
		}
	}
	// A source that fails sends no end marker: the agent sees a cut stream.
	boom := errors.New("client went away")
	enc = newChunkEncoder(io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(boom)), func() bool { return false })
	wire, err = io.ReadAll(enc)
	if !errors.Is(err, boom) || !errors.Is(enc.err, boom) {
		t.Fatalf("encoder error: %v / %v", err, enc.err)
	}
	if _, err := io.ReadAll(NewChunkReader(bytes.NewReader(wire))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("after a failed source: %v", err)
	}
	// An oversized chunk is refused before anything is read for it.
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], maxChunk+1)
	if _, err := io.ReadAll(NewChunkReader(bytes.NewReader(hdr[:]))); !errors.Is(err, errChunks) {
		t.Errorf("oversized chunk: %v", err)
	}
	// Stopped: the source is not read again.
	stopped = true
	enc = newChunkEncoder(iotest.ErrReader(errors.New("read after stop")), func() bool { return stopped })
	if _, err := enc.Read(make([]byte, 10)); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("stopped encoder: %v", err)
	}
}

// TestRemoteAgentMisbehaves: what a hostile agent answers is refused, never believed or held unbounded.
func TestRemoteAgentMisbehaves(t *testing.T) {
	reply := func(code int, stdout, stderr string) Runner {
		return func(ctx context.Context, arg string, stdin io.Reader, out, errw io.Writer, limit int64) (int, error) {
			if int64(len(stdout)) > limit {
				return 0, errors.New("over the bound")
			}
			io.WriteString(out, stdout)
			io.WriteString(errw, stderr)
			return code, nil
		}
	}
	ctx := context.Background()
	lim := Limits{MaxFileBytes: 10}
	for name, tc := range map[string]struct {
		run  Runner
		call func(*FS) error
	}{
		"stat garbage":        {reply(0, `{"name":"../x","mode":"0644","type":"file"}`, ""), func(f *FS) error { _, err := f.Stat("x"); return err }},
		"stat bad type":       {reply(0, `{"name":"x","mode":"0644","type":"fifo"}`, ""), func(f *FS) error { _, err := f.Stat("x"); return err }},
		"list not an array":   {reply(0, `{}`, ""), func(f *FS) error { _, err := f.List("."); return err }},
		"list trailing":       {reply(0, `[] []`, ""), func(f *FS) error { _, err := f.List("."); return err }},
		"read over the limit": {reply(0, `{"name":"x","size":11,"mode":"0644","type":"file"}`+"\n"+"01234567890", ""), func(f *FS) error { _, _, err := f.OpenFile("x"); return err }},
		"read a dir":          {reply(0, `{"name":"x","size":0,"mode":"0755","type":"dir"}`+"\n", ""), func(f *FS) error { _, _, err := f.OpenFile("x"); return err }},
		"write too many":      {reply(0, `{"bytes":11}`, ""), func(f *FS) error { _, err := f.Write(ctx, "x", strings.NewReader("a"), 0); return err }},
		"exit 2":              {reply(2, ``, "usage"), func(f *FS) error { _, err := f.Stat("x"); return err }},
		"forged code":         {reply(1, ``, `{"code":"SANDBOX_NOT_FOUND","message":"m"}`), func(f *FS) error { _, err := f.Stat("x"); return err }},
	} {
		f := OpenRemote(ctx, tc.run, lim)
		err := tc.call(f)
		f.Close()
		if err == nil || (!errors.Is(err, ErrAgent) && !strings.Contains(err.Error(), "bound")) {
			t.Errorf("%s: %v, want ErrAgent", name, err)
		}
	}
	// A download whose agent fails after the header reads as an error, never as a whole short file.
	f := OpenRemote(ctx, reply(1, `{"name":"x","size":5,"mode":"0644","type":"file"}`+"\nab", `{"message":"read x: EIO"}`), lim)
	defer f.Close()
	rc, _, err := f.OpenFile("x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if !errors.Is(err, ErrAgent) || string(b) != "ab" {
		t.Errorf("a download cut by the agent: %q, %v", b, err)
	}
}
