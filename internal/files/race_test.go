package files

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandkeep/sandkeep/internal/fault"
)

// exchange atomically swaps the names a and b in the directory open as dirfd (renameat2 RENAME_EXCHANGE), so
// that a path is always there, as a directory or as a link, never missing.
func exchange(dirfd int, a, b string) error {
	return unix.Renameat2(dirfd, a, dirfd, b, unix.RENAME_EXCHANGE)
}

// TestSymlinkRace plays a hostile sandbox: one goroutine swaps the directory d for links out of the
// workspace (relative and absolute) in a tight loop, another swaps d/sub the same way one level down, while
// the host downloads (OpenFile, WriteTar) and uploads (Write, ExtractTar) through d, over and over. Nothing
// outside the workspace may be read or written: no download returns outside data, and the outside directory
// is byte-for-byte unchanged.
func TestSymlinkRace(t *testing.T) {
	e := newEnv(t, Limits{})
	ctx := context.Background()
	_, err := e.fs.Write(ctx, "d/file.txt", strings.NewReader("inside"), 0o644)
	must(t, err)
	_, err = e.fs.Write(ctx, "d/sub/inner.txt", strings.NewReader("inside"), 0o644)
	must(t, err)
	must(t, os.Symlink("../out", filepath.Join(e.ws, "d.rel")))
	must(t, os.Symlink(e.out, filepath.Join(e.ws, "d.abs")))
	must(t, os.Symlink("../../out/sub", filepath.Join(e.ws, "d", "sub.rel")))
	must(t, os.Symlink(filepath.Join(e.out, "sub"), filepath.Join(e.ws, "d", "sub.abs")))

	wsDir, err := os.Open(e.ws)
	must(t, err)
	defer wsDir.Close()
	// d's own descriptor: d/sub is swapped in the real d wherever its name currently is, never through a link.
	dDir, err := os.Open(filepath.Join(e.ws, "d"))
	must(t, err)
	defer dDir.Close()

	deadline := time.Now().Add(3 * time.Second)
	if testing.Short() {
		deadline = time.Now().Add(500 * time.Millisecond)
	}
	stop := make(chan struct{})
	var swappers, workers sync.WaitGroup
	var swaps atomic.Int64
	swapper := func(dirfd int, name string) {
		defer swappers.Done()
		for {
			for _, link := range []string{name + ".rel", name + ".abs"} {
				select {
				case <-stop:
					return
				default:
				}
				if err := exchange(dirfd, name, link); err != nil {
					t.Errorf("swap %s: %v", name, err)
					return
				}
				swaps.Add(1)
				if err := exchange(dirfd, name, link); err != nil {
					t.Errorf("swap back %s: %v", name, err)
					return
				}
			}
		}
	}
	swappers.Add(2)
	go swapper(int(wsDir.Fd()), "d")
	go swapper(int(dDir.Fd()), "sub")

	var ok, refused atomic.Int64
	count := func(err error) {
		switch {
		case err == nil:
			ok.Add(1)
		case fault.CodeOf(err) == "":
			t.Errorf("a refusal without a failure code: %v", err)
		default:
			refused.Add(1)
		}
	}
	checkTar := func(b []byte) {
		if bytes.Contains(b, []byte(sentinel)) {
			t.Errorf("a tar carried data from outside the workspace")
		}
	}
	tarIntoD := buildTar(t, tarEntry{name: "x/", typ: tar.TypeDir}, tarEntry{name: "x/y.txt", body: "tar"},
		tarEntry{name: "secret", body: "tar"}, tarEntry{name: "sub/secret", body: "tar"})
	tarIntoRoot := buildTar(t, tarEntry{name: "d/secret", body: "tar"}, tarEntry{name: "d/sub/inner.txt", body: "inside"})
	worker := func(id int) {
		defer workers.Done()
		for i := 0; time.Now().Before(deadline); i++ {
			switch (id + i) % 6 {
			case 0:
				for _, p := range []string{"d/file.txt", "d/sub/inner.txt"} {
					rc, _, err := e.fs.OpenFile(p)
					count(err)
					if err == nil {
						b, _ := io.ReadAll(rc)
						rc.Close()
						if string(b) != "inside" {
							t.Errorf("OpenFile(%s) read %q", p, b)
						}
					}
				}
			case 1:
				var buf bytes.Buffer
				err := e.fs.WriteTar(ctx, "d", &buf)
				count(err)
				checkTar(buf.Bytes())
			case 2:
				var buf bytes.Buffer
				err := e.fs.WriteTar(ctx, ".", &buf)
				count(err)
				checkTar(buf.Bytes())
			case 3:
				_, err := e.fs.Write(ctx, fmt.Sprintf("d/up-%d.txt", id), strings.NewReader("upload"), 0o644)
				count(err)
				_, err = e.fs.Write(ctx, fmt.Sprintf("d/sub/up-%d.txt", id), strings.NewReader("upload"), 0o644)
				count(err)
			case 4:
				_, err := e.fs.ExtractTar(ctx, "d", bytes.NewReader(tarIntoD))
				count(err)
			case 5:
				_, err := e.fs.ExtractTar(ctx, ".", bytes.NewReader(tarIntoRoot))
				count(err)
				_, err = e.fs.List("d/sub")
				count(err)
			}
		}
	}
	for id := range 4 {
		workers.Add(1)
		go worker(id)
	}
	workers.Wait()
	close(stop)
	swappers.Wait()

	t.Logf("%d swaps; %d operations succeeded, %d refused", swaps.Load(), ok.Load(), refused.Load())
	if ok.Load() == 0 || refused.Load() == 0 || swaps.Load() == 0 {
		t.Errorf("the race was not exercised: %d swaps, %d succeeded, %d refused", swaps.Load(), ok.Load(), refused.Load())
	}
	e.untouched(t)
	e.noTemp(t)
}
