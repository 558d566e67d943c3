package feature

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/sandkeep/sandkeep/internal/egress"
	"github.com/sandkeep/sandkeep/internal/fault"
)

// LayerMediaType is the media type of a feature's one layer, a tar of its directory, as the devcontainers CLI
// publishes it.
const LayerMediaType = "application/vnd.devcontainers.layer.v1+tar"

// MaxManifestBytes bounds a feature's manifest.
const MaxManifestBytes = 4 << 20

// Registry fetches OCI features with oras-go, over HTTPS, anonymously. A feature's registry is the
// repository's choice, so a stranger's pull request picks the host sandkeep's host connects to: every address
// dialled, the registry's and every redirect's (and a token realm's), is checked before the dial against the
// egress proxy's address classes (loopback, private, link-local, metadata, ..., and the operator's Refused
// ranges; egress.AddrClass), unless its host is one the operator allowlisted (Allow). Plain HTTP is spoken only
// to an allowlisted loopback registry. Failures never repeat what the remote said (a redirect's address, a
// content type, an error body): issue 22 (finding 6) found redirects followed to anywhere and the error
// handing back the redirect URL, a port-scan oracle.
type Registry struct {
	// Allow lists registries the operator trusts (feature_registries): "host" or "host:port". Their addresses
	// are not checked, and a loopback one is spoken to over plain HTTP.
	Allow []string
	// Refused are the operator's refused address ranges (network.refused), refused like private ones.
	Refused []netip.Prefix
	// Client, when set, makes the requests instead (the caller then checks addresses); nil: the checked client.
	Client remote.Client

	once   sync.Once
	client remote.Client
	// dial connects once an address passed the check; nil: a net.Dialer. Tests count dials with it.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

var _ Fetcher = (*Registry)(nil)

// maxRedirects bounds the hops of one request.
const maxRedirects = 5

// Fetch resolves ref's tag (or digest), reads its manifest and the feature's layer (bounded, digests checked,
// the layer spooled into sp), and returns the layer's files and the manifest's digest. Failures are
// FEATURE_UNAVAILABLE naming the feature and the registry (refused, unreachable, not found), FEATURE_INVALID
// for an artifact that is not a feature, or wrap ctx's cause.
func (r *Registry) Fetch(ctx context.Context, ref Ref, sp *Spool) ([]File, string, error) {
	repo, err := remote.NewRepository(ref.Reference())
	if err != nil {
		return nil, "", invalid(ref.ID, "name the feature as registry/namespace/name:tag", "%v", err)
	}
	repo.PlainHTTP = loopback(ref.Registry) && r.allowed(ref.Registry)
	repo.Client = r.httpClient()
	unavailable := func(err error, what string) error {
		if ctx.Err() != nil {
			return fmt.Errorf("feature %q: %w", ref.ID, context.Cause(ctx))
		}
		return fault.Wrap(quiet{err}, fault.FeatureUnavailable,
			"make "+ref.Registry+" reachable from this host (an operator lists a registry on a refused address in feature_registries), or vendor the feature into .devcontainer/ and name it \"./dir\"",
			"feature %q: %s from registry %s failed: %s", ref.ID, what, ref.Registry, why(err))
	}
	reference := ref.Tag
	if ref.Digest != "" {
		reference = ref.Digest
	}
	desc, rc, err := repo.FetchReference(ctx, reference)
	if err != nil {
		return nil, "", unavailable(err, "fetching the manifest of "+ref.Reference())
	}
	if desc.Size > MaxManifestBytes {
		rc.Close()
		return nil, "", invalid(ref.ID, "publish the feature with the devcontainers CLI", "the manifest is %d bytes", desc.Size)
	}
	raw, err := content.ReadAll(rc, desc)
	rc.Close()
	if err != nil {
		return nil, "", unavailable(err, "reading the manifest of "+ref.Reference())
	}
	var man ocispec.Manifest
	if err := json.Unmarshal(raw, &man); err != nil || len(man.Layers) == 0 {
		return nil, "", invalid(ref.ID, "publish the feature with `devcontainer features publish`", "%s is not a feature's manifest", ref.Reference())
	}
	layer := man.Layers[0]
	for _, l := range man.Layers {
		if l.MediaType == LayerMediaType {
			layer = l
			break
		}
	}
	if layer.Size > MaxFeatureBytes {
		return nil, "", invalid(ref.ID, "publish a smaller feature", "its layer is %d bytes, over %d", layer.Size, MaxFeatureBytes)
	}
	blob, err := r.spoolLayer(ctx, repo, layer, sp)
	if err != nil {
		return nil, "", unavailable(err, "fetching the layer of "+ref.Reference())
	}
	defer blob.Close()
	files, err := untar(blob, sp)
	if err != nil {
		return nil, "", fault.Wrap(err, fault.FeatureInvalid, "publish the feature with `devcontainer features publish`",
			"feature %q: its layer: %v", ref.ID, err)
	}
	return files, desc.Digest.String(), nil
}

// spoolLayer reads layer, its digest and size checked, into a file of sp's directory (memory when it has none)
// and returns a reader of it positioned at the start; the file is removed when the reader is closed.
func (r *Registry) spoolLayer(ctx context.Context, repo *remote.Repository, layer ocispec.Descriptor, sp *Spool) (io.ReadCloser, error) {
	rc, err := repo.Fetch(ctx, layer)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	vr := content.NewVerifyReader(rc, layer)
	if sp == nil || sp.Dir == "" {
		b, err := io.ReadAll(io.LimitReader(vr, layer.Size))
		if err == nil {
			err = vr.Verify()
		}
		if err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(b)), nil
	}
	f, err := os.CreateTemp(sp.Dir, "layer-")
	if err != nil {
		return nil, err
	}
	drop := func() { f.Close(); os.Remove(f.Name()) }
	if _, err := io.Copy(f, io.LimitReader(vr, layer.Size)); err != nil {
		drop()
		return nil, err
	}
	if err := vr.Verify(); err != nil {
		drop()
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		drop()
		return nil, err
	}
	return removeOnClose{f}, nil
}

type removeOnClose struct{ *os.File }

func (f removeOnClose) Close() error {
	err := f.File.Close()
	os.Remove(f.Name())
	return err
}

// allowed reports whether hostport ("host" or "host:port") is one the operator allowlisted.
func (r *Registry) allowed(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	for _, a := range r.Allow {
		if strings.EqualFold(a, hostport) || strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}

// httpClient is the client requests go through: the caller's, or the checked one (oras-go's anonymous token
// flow over an http.Client whose dialer and redirects are checked).
func (r *Registry) httpClient() remote.Client {
	if r.Client != nil {
		return r.Client
	}
	r.once.Do(func() {
		dial := r.dial
		if dial == nil {
			dial = (&net.Dialer{Timeout: 30 * time.Second}).DialContext
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = nil // the check is of the address dialled: a proxy would dial for us, unchecked
		tr.DialContext = (&checkedDialer{allowed: r.allowed, refused: r.Refused, dial: dial}).DialContext
		hc := &http.Client{Transport: tr, CheckRedirect: r.checkRedirect}
		r.client = &auth.Client{Client: hc, Cache: auth.NewCache()}
	})
	return r.client
}

// checkRedirect checks each hop before it is followed: HTTPS, or plain HTTP to an allowlisted loopback
// registry only; an address literal of a refused class is refused here (a name is checked when it is dialled).
func (r *Registry) checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return errRefusedRedirect
	}
	host := req.URL.Host
	if req.URL.Scheme != "https" && !(req.URL.Scheme == "http" && loopback(host) && r.allowed(host)) {
		return errRefusedRedirect
	}
	if r.allowed(host) {
		return nil
	}
	if ip, err := netip.ParseAddr(strings.Trim(req.URL.Hostname(), "[]")); err == nil && egress.AddrClass(ip, r.Refused...) != "" {
		return errRefusedRedirect
	}
	return nil
}

// Why a fetch was refused before anything was dialled; the address is never part of the message.
var (
	errRefusedAddress  = errors.New("the registry's address is of a class sandkeep does not connect to for a repository (loopback, private, link-local, metadata or refused)")
	errRefusedRedirect = errors.New("the registry redirected to an address sandkeep does not follow (not HTTPS, a refused address class, or too many hops)")
)

// checkedDialer dials an address only after checking it: a host the operator allowlisted as it is, any other
// name resolved here and only its addresses outside the refused classes dialled (the one checked is the one
// dialled: no second resolution between check and dial).
type checkedDialer struct {
	allowed func(hostport string) bool
	refused []netip.Prefix
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
}

func (d *checkedDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.allowed(addr) {
		return d.dial(ctx, network, addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, errors.New("the registry's name does not resolve")
	}
	var errs []error
	for _, ip := range ips {
		if egress.AddrClass(ip, d.refused...) != "" {
			continue
		}
		c, err := d.dial(ctx, network, netip.AddrPortFrom(ip.Unmap(), portOf(port)).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, errRefusedAddress
	}
	return nil, errors.Join(errs...)
}

func portOf(s string) uint16 {
	n, _ := strconv.ParseUint(s, 10, 16)
	return uint16(n)
}

// quiet keeps a cause for errors.Is/As while its text, which may hold what the remote said, stays out of
// messages.
type quiet struct{ err error }

func (q quiet) Error() string { return "the registry request failed" }
func (q quiet) Unwrap() error { return q.err }

// why says in sandkeep's own words why a registry request failed, never in the remote's: a refusal, a status
// code, or that it could not connect.
func why(err error) string {
	var re *errcode.ErrorResponse
	var ne net.Error
	switch {
	case errors.Is(err, errRefusedAddress):
		return errRefusedAddress.Error()
	case errors.Is(err, errRefusedRedirect):
		return errRefusedRedirect.Error()
	case errors.As(err, &re):
		return fmt.Sprintf("it answered HTTP %d", re.StatusCode)
	case errors.Is(err, errdef.ErrNotFound):
		return "not found"
	case errors.Is(err, content.ErrMismatchedDigest), errors.Is(err, content.ErrTrailingData):
		return "its content does not match its digest"
	case errors.As(err, &ne) && ne.Timeout():
		return "it did not answer in time"
	default:
		return "it could not be reached"
	}
}

// loopback reports a registry host on the loopback interface.
func loopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// untar reads a feature's layer (a tar, optionally gzipped) into sp: regular files and directories only, every
// name clean and inside the archive, bounded.
func untar(blob io.Reader, sp *Spool) ([]File, error) {
	br := bufio.NewReader(blob)
	var rd io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, err
		}
		rd = io.LimitReader(zr, MaxFeatureBytes+1)
	}
	if sp == nil {
		sp = &Spool{}
	}
	tr := tar.NewReader(rd)
	var files []File
	seen := map[string]bool{}
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		name := strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(h.Name, "./")), "/")
		if strings.Contains(h.Name, "..") && name != path.Clean(strings.TrimPrefix(h.Name, "./")) {
			return nil, fmt.Errorf("entry %q leaves the archive", short(h.Name))
		}
		switch h.Typeflag {
		case tar.TypeDir:
			continue
		case tar.TypeReg:
		default:
			return nil, fmt.Errorf("entry %q is not a regular file or directory", short(h.Name))
		}
		if name == "" || name == "." || seen[name] {
			return nil, fmt.Errorf("entry %q is empty or repeated", short(h.Name))
		}
		if len(files) == MaxFeatureFiles {
			return nil, fmt.Errorf("more than %d files", MaxFeatureFiles)
		}
		f, err := sp.take(name, h.FileInfo().Mode().Perm(), tr, MaxFeatureBytes-total)
		if err != nil {
			return nil, err
		}
		total += f.Size
		seen[name] = true
		files = append(files, f)
	}
}
