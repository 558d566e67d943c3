package ui

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

// CookieName is the session cookie. It holds a random session id, never the token.
const CookieName = "sandkeep_ui"

// session is one signed-in browser. It keeps the token's hash, not the token: every request looks the token up
// by that hash again, so a revoked or expired token ends the session at once.
type session struct {
	id        string
	tokenHash string
	operator  bool   // opened with Config.OperatorToken, not a tenant's token
	csrf      string // the per-session CSRF token every action form carries
	expires   time.Time
}

// sessions is the server-side session table.
type sessions struct {
	ttl time.Duration
	max int
	now func() time.Time

	mu   sync.Mutex          // guards byID
	byID map[string]*session // at most max; expired ones are dropped when seen and on every new sign-in
}

func newSessions(ttl time.Duration, max int, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, max: max, now: now, byID: map[string]*session{}}
}

func randomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics when the kernel has no randomness)
	return base64.RawURLEncoding.EncodeToString(b)
}

// open makes a session for the token with hash.
func (s *sessions) open(hash string, operator bool) *session {
	now := s.now()
	ss := &session{id: randomID(), tokenHash: hash, operator: operator, csrf: randomID(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest *session
	for id, o := range s.byID {
		if !now.Before(o.expires) {
			delete(s.byID, id)
			continue
		}
		if oldest == nil || o.expires.Before(oldest.expires) {
			oldest = o
		}
	}
	if len(s.byID) >= s.max && oldest != nil {
		delete(s.byID, oldest.id)
	}
	s.byID[ss.id] = ss
	return ss
}

// get returns the live session with id, or nil.
func (s *sessions) get(id string) *session {
	if id == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byID[id]
	if ss == nil {
		return nil
	}
	if !s.now().Before(ss.expires) {
		delete(s.byID, id)
		return nil
	}
	return ss
}

func (s *sessions) close(id string) {
	s.mu.Lock()
	delete(s.byID, id)
	s.mu.Unlock()
}

// viewer is who a request is from: the session and its token, as looked up for this request.
type viewer struct {
	sess     *session
	tok      store.Token
	admin    bool // may stop and remove the sandboxes it sees
	operator bool // the installation's operator (Config.OperatorToken): sees every tenant
}

// scope is the tenant the viewer is confined to; "" for the operator, who sees every tenant. A tenant's admin
// token administers its own tenant only.
func (v *viewer) scope() string {
	if v.operator {
		return ""
	}
	return v.tok.Tenant
}

// sees reports whether the viewer may see an object of tenant.
func (v *viewer) sees(tenant string) bool { return v.operator || tenant == v.tok.Tenant }

// operatorToken is the viewer token an operator session stands for: no tenant, every scope.
var operatorToken = store.Token{ID: "operator", Name: "operator", Scopes: []string{auth.ScopeAdmin}}

type viewerHandler func(w http.ResponseWriter, r *http.Request, v *viewer)

// authed wraps h: a live session whose token is still live and carries the read scope; else the sign-in page. A
// POST must carry the session's CSRF token.
func (u *UI) authed(h viewerHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := u.viewerOf(r)
		if v == nil {
			u.clearCookie(w, r)
			if r.Method == http.MethodGet && r.Header.Get("Accept") != "text/event-stream" {
				http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
				return
			}
			u.fail(w, r, nil, http.StatusUnauthorized, "You are not signed in, or your session ended.",
				"Sign in again with your API token.")
			return
		}
		if r.Method == http.MethodPost {
			got := r.PostFormValue("csrf")
			if subtle.ConstantTimeCompare([]byte(got), []byte(v.sess.csrf)) != 1 {
				u.fail(w, r, v, http.StatusForbidden, "This form is out of date or did not come from this dashboard.",
					"Reload the page and try again.")
				return
			}
		}
		h(w, r, v)
	}
}

// viewerOf returns the viewer of r, or nil when r has no live session or its token is no longer live.
func (u *UI) viewerOf(r *http.Request) *viewer {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return nil
	}
	ss := u.sessions.get(c.Value)
	if ss == nil {
		return nil
	}
	if ss.operator {
		if !u.isOperator(ss.tokenHash) { // the operator token changed: its sessions end
			u.sessions.close(ss.id)
			return nil
		}
		return &viewer{sess: ss, tok: operatorToken, admin: true, operator: true}
	}
	tok, err := u.cfg.Tokens.TokenByHash(r.Context(), ss.tokenHash)
	if err != nil || auth.Status(tok, u.now()) != auth.StatusLive || tok.Tenant == "" || !auth.Allows(tok, auth.ScopeRead) {
		if err == nil || isNotFound(err) {
			u.sessions.close(ss.id)
		}
		return nil
	}
	return &viewer{sess: ss, tok: tok, admin: slices.Contains(tok.Scopes, auth.ScopeAdmin)}
}

var errNoRead = errors.New("the token lacks the read scope")

func isNotFound(err error) bool { return errdefs.IsNotFound(err) }

func (u *UI) setCookie(w http.ResponseWriter, r *http.Request, ss *session) {
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: ss.id, Path: Prefix, Expires: ss.expires,
		MaxAge: int(u.cfg.SessionTTL / time.Second), HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

func (u *UI) clearCookie(w http.ResponseWriter, r *http.Request) {
	if _, err := r.Cookie(CookieName); err != nil {
		return
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

func (u *UI) handleSignInPage(w http.ResponseWriter, r *http.Request) {
	if u.viewerOf(r) != nil {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	u.render(w, r, nil, http.StatusOK, "signin", signinData{})
}

type signinData struct{ Error string }

// handleSignIn checks the posted token. Every refused token gets the same answer (auth.Verify), and a token
// without the read scope is refused too: the dashboard only reads (and acts with admin).
func (u *UI) handleSignIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	token := r.PostFormValue("token")
	if sum := sha256.Sum256([]byte(token)); token != "" && u.isOperator(hex.EncodeToString(sum[:])) {
		ss := u.sessions.open(hex.EncodeToString(sum[:]), true)
		u.setCookie(w, r, ss)
		u.log.Info("ui: signed in", "token", "operator")
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	tok, err := auth.Verify(r.Context(), u.cfg.Tokens, "Bearer "+token, u.now())
	if err == nil && (tok.Tenant == "" || !auth.Allows(tok, auth.ScopeRead)) {
		err = errNoRead
	}
	if err != nil && fault.CodeOf(err) == fault.StoreUnavailable {
		u.log.Error("ui: sign-in: the token store failed", "err", err)
		u.render(w, r, nil, http.StatusServiceUnavailable, "signin", signinData{
			Error: "The server cannot check tokens right now (its store does not answer). Try again shortly."})
		return
	}
	if err != nil {
		u.log.Info("ui: sign-in refused", "remote", r.RemoteAddr)
		u.render(w, r, nil, http.StatusUnauthorized, "signin", signinData{
			Error: "That token was not accepted: it is unknown, revoked, expired, or lacks the read scope. " +
				"Ask the operator for one (sandkeep token create --scopes read)."})
		return
	}
	ss := u.sessions.open(tok.Hash, false)
	u.setCookie(w, r, ss)
	u.log.Info("ui: signed in", "token", tok.ID, "tenant", tok.Tenant)
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

func (u *UI) handleSignOut(w http.ResponseWriter, r *http.Request, v *viewer) {
	u.sessions.close(v.sess.id)
	u.clearCookie(w, r)
	http.Redirect(w, r, Prefix+"signin", http.StatusSeeOther)
}

// isOperator reports whether hash (hex SHA-256) is the operator token's, in constant time; never without one.
func (u *UI) isOperator(hash string) bool {
	if u.cfg.OperatorToken == "" {
		return false
	}
	want := sha256.Sum256([]byte(u.cfg.OperatorToken))
	return subtle.ConstantTimeCompare([]byte(hash), []byte(hex.EncodeToString(want[:]))) == 1
}
