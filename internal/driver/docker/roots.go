package docker

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"

	"github.com/moby/moby/client"
)

// rootsPaths are where images keep their trust store, most common first (Debian/Ubuntu/Alpine, Fedora/RHEL,
// others).
var rootsPaths = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// maxRoots bounds the trust store read; real ones are about 200 KiB.
const maxRoots = 2 << 20

// rootsReader is the engine call ReadRoots makes.
type rootsReader interface {
	CopyFromContainer(ctx context.Context, id string, opts client.CopyFromContainerOptions) (client.CopyFromContainerResult, error)
}

// ReadRoots returns the certificates of the trust store of sandbox name's image, re-encoded as PEM: the egress
// proxy's CA bundle keeps them, so a client pointed at the bundle still trusts what it trusted before. This is the
// one read from a live container through the engine's archive API; the engine resolves the path inside the
// container's root, the read is bounded, and only blocks that parse as certificates are kept. What comes back goes
// only to the same sandbox.
func (d *Driver) ReadRoots(ctx context.Context, name string) ([]byte, error) {
	r, ok := d.api.(rootsReader)
	if !ok {
		return nil, errors.New("engine cannot read files")
	}
	var lastErr error
	for _, p := range rootsPaths {
		b, err := readOne(ctx, r, name, p)
		if err == nil {
			return certificatesOnly(b), nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func readOne(ctx context.Context, r rootsReader, name, path string) ([]byte, error) {
	res, err := r.CopyFromContainer(ctx, name, client.CopyFromContainerOptions{SourcePath: path})
	if err != nil {
		return nil, err
	}
	defer res.Content.Close()
	tr := tar.NewReader(res.Content)
	h, err := tr.Next()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if h.Typeflag != tar.TypeReg || h.Size > maxRoots {
		return nil, fmt.Errorf("read %s: not a regular file of at most %d bytes", path, maxRoots)
	}
	return io.ReadAll(io.LimitReader(tr, maxRoots))
}

// certificatesOnly keeps the PEM CERTIFICATE blocks of b that parse.
func certificatesOnly(b []byte) []byte {
	var out bytes.Buffer
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out.Bytes()
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(blk.Bytes); err != nil {
			continue
		}
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: blk.Bytes})
	}
}
