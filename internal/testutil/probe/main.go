// Command skprobe is a tiny static network client that tests place in a sandbox (testutil.ProbeImage): the test
// image's busybox has no working HTTP client here (its static wget crashes) and no TLS. Every subcommand prints
// one line a test can match and exits 0 on success, 1 on failure, 2 on bad usage.
//
//	skprobe http URL [HEADER=VALUE...]   GET URL through $HTTP(S)_PROXY; prints "status N denied=R" and the body
//	skprobe proxied URL                   GET URL through the proxy even when NO_PROXY names its host
//	skprobe post URL BODY [HEADER=VALUE...]   POST BODY the same way
//	skprobe tcp HOST:PORT                 a direct TCP connect, no proxy
//	skprobe udp HOST:PORT TEXT            one direct UDP datagram
//	skprobe dns NAME [SERVER]             a lookup through /etc/resolv.conf, or through SERVER (host:port)
//	skprobe sni HOST:PORT SNI             CONNECT HOST:PORT through the proxy, then a TLS handshake naming SNI
//	skprobe unix PATH                     connect to a Unix socket and wait for the peer to hang up
//	skprobe serve ADDR TEXT               an HTTP server on ADDR answering every GET with TEXT and the path asked
//	                                      for; prints "listening ADDR" once it accepts, runs until killed
//	skprobe echo ADDR                     a TCP server on ADDR sending each connection's bytes back until the
//	                                      client half-closes, then half-closing; prints "listening ADDR"
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: skprobe http|post|tcp|udp|dns|sni|unix ARGS")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "http":
		err = get(http.MethodGet, os.Args[2], "", os.Args[3:])
	case "proxied": // through $HTTP_PROXY even for loopback, which Go's clients (and NO_PROXY) never proxy
		forceProxy = true
		err = get(http.MethodGet, os.Args[2], "", os.Args[3:])
	case "post":
		if len(os.Args) < 4 {
			os.Exit(2)
		}
		err = get(http.MethodPost, os.Args[2], os.Args[3], os.Args[4:])
	case "tcp":
		var c net.Conn
		if c, err = net.DialTimeout("tcp", os.Args[2], 2*time.Second); err == nil {
			c.Close()
			fmt.Println("connected")
		}
	case "udp":
		var c net.Conn
		if c, err = net.Dial("udp", os.Args[2]); err == nil {
			_, err = c.Write([]byte(os.Args[3]))
			c.Close()
			if err == nil {
				fmt.Println("sent")
			}
		}
	case "dns":
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		r := net.DefaultResolver
		if len(os.Args) > 3 { // a query to this server, whatever /etc/resolv.conf says
			server := os.Args[3]
			r = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "udp", server)
			}}
		}
		var addrs []string
		if addrs, err = r.LookupHost(ctx, os.Args[2]); err == nil {
			fmt.Println("resolved", strings.Join(addrs, ","))
		}
	case "sni":
		err = sni(os.Args[2], os.Args[3])
	case "serve":
		if len(os.Args) < 4 {
			os.Exit(2)
		}
		err = serveHTTP(os.Args[2], os.Args[3])
	case "echo":
		err = serveEcho(os.Args[2])
	case "unix":
		var c net.Conn
		if c, err = net.DialTimeout("unix", os.Args[2], 2*time.Second); err == nil {
			_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, rerr := c.Read(make([]byte, 1))
			c.Close()
			fmt.Println("connected, then", rerr)
		}
	default:
		os.Exit(2)
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
}

// forceProxy: send every request through $HTTP_PROXY.
var forceProxy bool

func get(method, u, body string, headers []string) error {
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		return err
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, "=")
		req.Header.Set(k, os.ExpandEnv(v))
	}
	proxy := http.ProxyFromEnvironment
	if forceProxy {
		pu, err := url.Parse(os.Getenv("HTTP_PROXY"))
		if err != nil {
			return err
		}
		proxy = http.ProxyURL(pu)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: proxy, ForceAttemptHTTP2: true}}
	res, err := c.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	fmt.Printf("status %d denied=%s proto=%s\n%s\n", res.StatusCode, res.Header.Get("X-Sandkeep-Denied"), res.Proto, b)
	return nil
}

// sni opens a CONNECT tunnel to target through $HTTPS_PROXY and starts TLS naming serverName, which need not be
// target: a proxy that inspects TLS must refuse the mismatch.
func sni(target, serverName string) error {
	pu, err := url.Parse(os.Getenv("HTTPS_PROXY"))
	if err != nil || pu.Host == "" {
		return fmt.Errorf("no usable HTTPS_PROXY")
	}
	c, err := net.DialTimeout("tcp", pu.Host, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	pass, _ := pu.User.Password()
	auth := base64.StdEncoding.EncodeToString([]byte(pu.User.Username() + ":" + pass))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", target, target, auth)
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("CONNECT: status %d denied=%s", res.StatusCode, res.Header.Get("X-Sandkeep-Denied"))
	}
	tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	fmt.Println("handshake ok")
	return nil
}

// serveHTTP answers every request on addr with text, a space and the request's path, until killed.
func serveHTTP(addr, text string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening", ln.Addr())
	return http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", text, r.URL.Path)
	}))
}

// serveEcho copies each connection's bytes back to it until the client half-closes, then half-closes, until killed.
func serveEcho(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Println("listening", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			if _, err := io.Copy(c, c); err == nil {
				_ = c.(*net.TCPConn).CloseWrite()
			}
		}()
	}
}
