package files

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// heapGrowth runs fn and returns how many bytes it allocated in all (TotalAlloc), which is what a transfer
// that buffered the file, even briefly, would show.
func heapGrowth(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// maxGrowth is what one transfer may allocate, whatever the file's size: buffers and bookkeeping.
const maxGrowth = 4 << 20

// TestStreamsWithBoundedMemory moves a 100 MiB file up, down, and through a tar round trip, and checks that
// none of it allocates more than a few MiB.
func TestStreamsWithBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 300 MiB through the disk")
	}
	const size = 100 << 20
	e := newEnv(t, Limits{})
	ctx := context.Background()

	want := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{3}), size), want)
	var n int64
	var err error
	grew := heapGrowth(func() { n, err = e.fs.Write(ctx, "big/file.bin", src, 0o644) })
	t.Logf("Write of %d MiB allocated %d KiB", size>>20, grew>>10)
	if grew > maxGrowth {
		t.Errorf("Write of %d MiB allocated %d KiB", size>>20, grew>>10)
	}
	must(t, err)
	if n != size {
		t.Fatalf("wrote %d bytes", n)
	}
	wantSum := want.Sum(nil)

	got := sha256.New()
	grew = heapGrowth(func() {
		rc, _, err := e.fs.OpenFile("big/file.bin")
		must(t, err)
		_, err = io.Copy(got, rc)
		must(t, err)
		must(t, rc.Close())
	})
	t.Logf("reading it allocated %d KiB", grew>>10)
	if grew > maxGrowth {
		t.Errorf("reading %d MiB allocated %d KiB", size>>20, grew>>10)
	}
	if !bytes.Equal(got.Sum(nil), wantSum) {
		t.Fatal("the file read back differs from what was written")
	}

	// WriteTar into ExtractTar through a pipe: both ends stream.
	dst := newEnv(t, Limits{})
	var sum TarSummary
	var werr, xerr error
	grew = heapGrowth(func() {
		pr, pw := io.Pipe()
		done := make(chan struct{})
		go func() {
			defer close(done)
			werr = e.fs.WriteTar(ctx, "big", pw)
			pw.CloseWithError(werr)
		}()
		sum, xerr = dst.fs.ExtractTar(ctx, "copy", pr)
		pr.CloseWithError(io.ErrClosedPipe)
		<-done
	})
	t.Logf("a tar round trip of it allocated %d KiB", grew>>10)
	if grew > 2*maxGrowth {
		t.Errorf("a tar round trip of %d MiB allocated %d KiB", size>>20, grew>>10)
	}
	must(t, werr)
	must(t, xerr)
	if sum.Files != 1 || sum.Bytes != size {
		t.Fatalf("summary %+v", sum)
	}
	f, err := os.Open(filepath.Join(dst.ws, "copy", "file.bin"))
	must(t, err)
	defer f.Close()
	got.Reset()
	_, err = io.Copy(got, f)
	must(t, err)
	if !bytes.Equal(got.Sum(nil), wantSum) {
		t.Fatal("the file through a tar round trip differs")
	}
}

// repeatReader reads block over and over, n bytes in all, without allocating.
type repeatReader struct {
	block []byte
	off   int
	n     int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.n {
		p = p[:r.n]
	}
	c := copy(p, r.block[r.off:])
	r.off = (r.off + c) % len(r.block)
	r.n -= int64(c)
	return c, nil
}

const benchSize = 64 << 20

func benchBlock() []byte {
	b := make([]byte, 1<<20)
	rand.NewChaCha8([32]byte{9}).Read(b)
	return b
}

func BenchmarkWrite(b *testing.B) {
	e := newEnv(b, Limits{})
	block := benchBlock()
	ctx := context.Background()
	b.SetBytes(benchSize)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.fs.Write(ctx, "bench.bin", &repeatReader{block: block, n: benchSize}, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRead(b *testing.B) {
	e := newEnv(b, Limits{})
	if _, err := e.fs.Write(context.Background(), "bench.bin", &repeatReader{block: benchBlock(), n: benchSize}, 0o644); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, bufSize)
	b.SetBytes(benchSize)
	b.ReportAllocs()
	for b.Loop() {
		rc, _, err := e.fs.OpenFile("bench.bin")
		if err != nil {
			b.Fatal(err)
		}
		if n, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, rc, buf); err != nil || n != benchSize {
			b.Fatal(n, err)
		}
		rc.Close()
	}
}
