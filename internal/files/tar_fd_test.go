package files

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fdCounter is an io.Writer that records the most descriptors the process held while it was written to.
type fdCounter struct {
	buf bytes.Buffer
	max int
}

func openFDs() int {
	ents, _ := os.ReadDir("/proc/self/fd")
	return len(ents)
}

func (c *fdCounter) Write(p []byte) (int, error) {
	c.max = max(c.max, openFDs())
	return c.buf.Write(p)
}

// TestTarDeepTreeDescriptors: archiving a tree 200 directories deep (a file at every level) holds a few
// descriptors, not one per level, and the archive still has every entry in name order.
func TestTarDeepTreeDescriptors(t *testing.T) {
	const depth = 200
	e := newEnv(t, Limits{})
	p := e.ws
	var want []string
	rel := ""
	for i := range depth {
		name := "d"
		p, rel = filepath.Join(p, name), rel+name+"/"
		must(t, os.Mkdir(p, 0o755))
		must(t, os.WriteFile(filepath.Join(p, "f.txt"), []byte{byte('a' + i%26)}, 0o644))
		want = append(want, rel)
	}
	before := openFDs()
	var w fdCounter
	must(t, e.fs.WriteTar(context.Background(), ".", &w))
	if held := w.max - before; held > 10 {
		t.Errorf("archiving %d levels held %d more descriptors, want a few", depth, held)
	}
	tr := tar.NewReader(&w.buf)
	var dirs []string
	files := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(t, err)
		if strings.HasSuffix(hdr.Name, "/") {
			dirs = append(dirs, hdr.Name)
		} else {
			files++
		}
	}
	if strings.Join(dirs, ",") != strings.Join(want, ",") || files != depth {
		t.Errorf("archive has %d directories and %d files, want %d of each, in order", len(dirs), files, depth)
	}
}
