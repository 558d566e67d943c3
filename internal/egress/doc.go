// Package egress controls where a sandbox may connect to: the rule language and matcher (rules.go), and the
// per-sandbox forward proxy that enforces a Policy (proxy.go), optionally decrypting TLS (inspect.go, ca.go)
// to inject credentials (creds.go).
//
// # Rules and decisions
//
// A rule names a host (exact, "*.x" one label, "**.x" any depth and x itself, "**" everything), an IP
// address or a CIDR, optionally with a port and a leading "!" that negates it; the last matching rule wins.
// Hosts are normalised first (case, trailing dot, IDN to punycode, every numeric IPv4 spelling read as the
// address). The proxy resolves a name once, checks every address against the refused classes (loopback,
// private, link-local, metadata, ...; only an IP or CIDR rule unlocks one), and dials exactly the addresses
// it checked. Each request is decided under the policy current when it is decided: SetPolicy swaps the whole
// compiled policy atomically, and a TLS-inspected connection is decided again on every request.
//
// # Narrowing
//
// A caller's network block narrows its template's policy (narrow.go): Narrow keeps the template's Policy whole
// and sets Policy.Narrow to the caller's rules, which every request must pass as well (mode none refuses all;
// an allowlist refuses what it does not list or negates). A refused address class needs an IP or CIDR rule of
// both to unlock it. Narrow refuses (NetworkWidened) what the caller cannot get: credentials, another inspection
// setting, a host outside the template's, and an allowing IP or CIDR rule that is not the template's own.
//
// # TLS inspection
//
// Policy.Inspect is "auto" (on when the policy has credentials), "on" or "off". On, the proxy holds an
// ephemeral CA (ECDSA P-256, valid for 24 hours, backdated five minutes, private key in memory only), made on
// first need and renewed by CACert when less than six hours remain; CAGeneration (or CA) tells the caller
// when to rewrite the bundle the sandbox trusts. The CA is name-constrained where X.509 can express the
// policy: in allowlist mode, its allowing host rules become permitted DNS domains (x, *.x and **.x all
// become x, which X.509 reads as x and every name under it), its allowing IP and CIDR rules permitted IP
// ranges, and every other IP address is excluded; an allowlist with "**", and denylist and open modes, give
// an unconstrained CA; mode none constrains it to "invalid". SetPolicy replaces the CA when the constraints
// change.
//
// An allowed CONNECT is answered 200 and the client's TLS handshake is served with a leaf for the CONNECT
// host (leaves are cached per host, 256 per CA). A ClientHello whose SNI is not the CONNECT host is refused
// (Block reason sni-mismatch); no SNI means the CONNECT host; a client that does not start TLS is cut off
// (not-tls). ALPN offers h2 and http/1.1. Each decrypted request must name the CONNECT host (else
// host-mismatch) and may not be a CONNECT or an absolute-form request for elsewhere (proxy-loop); it is
// decided again, given its credentials, and forwarded over TLS verified against Config.UpstreamRoots (nil:
// the host's roots) to the checked addresses; the upstream is dialed per request, so an unreachable host is
// a 502 on a request rather than on the CONNECT. Protocol upgrades (WebSocket) in decrypted and in plain-HTTP
// requests are not forwarded: the upstream sees no Upgrade header.
//
// Inspection off, a CONNECT is a plain byte tunnel (spliced in the kernel between sockets), except that the
// proxy reads the client's TLS ClientHello first (hello.go, without answering it) and ends the tunnel when its
// server name is not the CONNECT host (sni-fronting) or is missing for a CONNECT to a name (sni-missing); a
// tunnel that does not start with a TLS handshake passes unread. Credentials reach nothing inside a plain tunnel.
//
// # Sessions
//
// Begin and End make each command a session (session.go): Begin installs the command's policy and the only
// token accepted; End revokes the token, sets mode none and closes every tunnel, decrypted connection and
// upstream connection (pooled or busy) opened in it, so nothing outlives the command whose policy allowed it.
// Beside that one, Open starts any number of concurrent sessions (sessions.go), one per command or process in
// flight, each with its own token, policy, credentials, refusal and reflection reports, forwarding pools and (when
// it inspects) CA; a request belongs to the session whose token it carries, and Session.End closes what was opened
// in that session only.
//
// # Credentials
//
// A Credential's Value never enters the sandbox, which sees only its Placeholder (NewPlaceholder). On a
// request to a host its Hosts rules allow, over inspected TLS (plain HTTP only with AllowPlaintext; a plain
// request carrying the placeholder is otherwise refused, credential-plaintext), the proxy puts the value
// where the definition says and nowhere else: in Header (default Authorization) when its value is
// "<Scheme> <placeholder>" (default Bearer; Basic takes the placeholder as the user or password of a Basic
// credential, decoded and encoded again), and in the Fields it opts into (header:<Name>, form:<field>,
// json:<member>, in the first 1 MiB of the body). A placeholder anywhere else is forwarded unchanged. A
// request to any other host that carries a placeholder or the value of a credential it may not receive, in
// its URL (raw or unescaped), a header (a Basic credential decoded) or the first 1 MiB of its body, is refused
// 403 with a credential-leak Block naming the credential, before any of it reaches the upstream. Request
// trailers are dropped while a policy has credentials (they arrive after the request was checked).
//
// Responses from a host that received a credential are scrubbed (scrub.go): every form of the value the proxy
// produced (literal, percent-encoded, base64 in four alphabets, the Basic credential it wrote and its escapes)
// becomes the placeholder's form, in the headers and, streaming in bounded memory, in the whole body; the
// request asks for an unencoded response, response trailers are dropped, and each scrub is a Reflection
// (OnReflected). A value encoded some other way, or a body compressed against the request, is not scrubbed;
// the value still only goes to the credential's own hosts.
//
// The leak check matches the literal bytes, plus the two decodings above; a program inside the sandbox can
// always encode a placeholder some other way. That does not leak the secret: the value is only ever written
// into requests to the credential's own hosts. A value never appears in a Block, an error or a log, and
// Credential's String and GoString leave it out.
package egress
