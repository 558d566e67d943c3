package devcontainer

import (
	"strconv"
	"strings"
	"testing"
)

// TestParseForwardPort: the forms real files write, read as the devcontainers CLI reads them.
func TestParseForwardPort(t *testing.T) {
	for _, c := range []struct {
		entry    string
		host     string
		port     int
		loopback bool
	}{
		{"3000", "", 3000, true},
		{"localhost:3000", "localhost", 3000, true},
		{"LocalHost:8080", "localhost", 8080, true},
		{"127.0.0.1:5173", "127.0.0.1", 5173, true},
		{"db:5432", "db", 5432, false},
		{"my_cache.internal:6379", "my_cache.internal", 6379, false},
		{"[::1]:9000", "::1", 9000, false},
		{"0.0.0.0:3000", "0.0.0.0", 3000, false},
		{"65535", "", 65535, true},
	} {
		fp, err := ParseForwardPort(c.entry)
		if err != nil {
			t.Errorf("%q: %v", c.entry, err)
			continue
		}
		if fp.Host != c.host || fp.Port != c.port || fp.Loopback() != c.loopback || fp.Entry != c.entry {
			t.Errorf("%q: %+v loopback %v, want host %q port %d loopback %v", c.entry, fp, fp.Loopback(), c.host, c.port, c.loopback)
		}
	}
	for _, bad := range []string{"", "0", "65536", "3000-3005", "03000", "+80", " 80", "db:", ":80", "db:http",
		"a:b:c", "db:5432:1", "ho st:80", "db/x:80", "http://localhost:3000", "localhost:0", "::1:80"} {
		if fp, err := ParseForwardPort(bad); err == nil {
			t.Errorf("%q read as %+v, want an error", bad, fp)
		} else if !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("%q: error %q does not quote the entry", bad, err)
		}
	}
}

// FuzzParseForwardPort: an entry is either an error or a port in 1..65535 whose host, when there is one, is
// a name or an address with no ':' left over except inside an IPv6 address, and which spells back to the entry
// (case aside). It never panics. Seeds: testdata/fuzz/FuzzParseForwardPort.
func FuzzParseForwardPort(f *testing.F) {
	for _, s := range []string{"3000", "localhost:3000", "db:5432", "[::1]:80", "0", "a:b:c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fp, err := ParseForwardPort(s)
		if err != nil {
			return
		}
		if fp.Port < 1 || fp.Port > 65535 {
			t.Fatalf("%q: port %d", s, fp.Port)
		}
		back := strconv.Itoa(fp.Port)
		if fp.Host != "" {
			h := fp.Host
			if strings.Contains(h, ":") {
				h = "[" + h + "]"
			}
			back = h + ":" + back
		}
		if !strings.EqualFold(back, s) {
			t.Fatalf("%q spells back as %q", s, back)
		}
		if fp.Loopback() != (fp.Host == "" || fp.Host == "localhost" || fp.Host == "127.0.0.1") {
			t.Fatalf("%q: loopback %v", s, fp.Loopback())
		}
	})
}
