package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/containerd/errdefs"
	"github.com/spf13/cobra"

	"github.com/sandkeep/sandkeep/internal/auth"
	"github.com/sandkeep/sandkeep/internal/fault"
	"github.com/sandkeep/sandkeep/internal/store"
)

const tokenLong = `Tokens authenticate the clients of 'sandkeep serve': every request carries "Authorization: Bearer <token>".
A token belongs to one tenant, and everything done with it is confined to that tenant's sandboxes, runs, events
and files. Its scopes say what it may do: exec (run commands), files (read and write workspace files), read
(list and inspect), admin (all of these, and removing sandboxes).

The store (--store) keeps only a token's SHA-256: 'token create' prints the token once, and it cannot be shown
again. A revocation or an expiry takes effect on the server's next request.`

func newToken(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke the API tokens of 'sandkeep serve'",
		Long:  tokenLong,
		Example: "  sandkeep token create --tenant acme --name ci --scopes exec,files --expires 30d\n" +
			"  sandkeep token list --tenant acme\n" +
			"  sandkeep token revoke tok_0123456789abcdef",
		// Runnable, so that a mistyped subcommand is an error (cobra only prints the help of a command that
		// cannot run, whatever its arguments).
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			return fault.New(fault.InvalidArgument, fmt.Sprintf("see '%s --help'", cmd.CommandPath()),
				"unknown command %q for %q", args[0], cmd.CommandPath())
		},
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTokenCreate(g), newTokenList(g), newTokenRevoke(g))
	return cmd
}

// tokenCreated is the `token create --json` object: the only time the token itself is shown.
type tokenCreated struct {
	ID        string     `json:"id"`
	Tenant    string     `json:"tenant"`
	Name      string     `json:"name"`
	Scopes    []string   `json:"scopes"`
	ExpiresAt *time.Time `json:"expires_at"` // null: never
	Token     string     `json:"token"`
}

func newTokenCreate(g *globals) *cobra.Command {
	var (
		asJSON               bool
		tenant, name, scopes string
		expires              string
	)
	cmd := &cobra.Command{
		Use:   "create --tenant T --name N [--scopes exec,files,read] [--expires 30d] [--json]",
		Short: "Create a token for a tenant and print it, once",
		Long: "create records a new token of tenant T named N (unique among T's live tokens) and prints the token on\n" +
			"stdout, alone on its line, so that TOKEN=$(sandkeep token create ...) captures it; what was created is\n" +
			"said on stderr. With --json, stdout is one object {id, tenant, name, scopes, expires_at, token}.\n" +
			"The token is not stored anywhere: it cannot be shown again.",
		Example: "  sandkeep token create --tenant acme --name ci\n" +
			"  sandkeep token create --tenant acme --name deploy --scopes admin --expires 12h --json",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fail := jsonFail(g, asJSON)
			spec, err := tokenSpec(cmd, tenant, name, scopes, expires)
			if err != nil {
				return fail(err)
			}
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return fail(err)
			}
			defer st.Close()
			tok, secret, err := auth.Create(cmd.Context(), st, spec, time.Now())
			if err != nil {
				return fail(err)
			}
			if asJSON {
				out := tokenCreated{ID: tok.ID, Tenant: tok.Tenant, Name: tok.Name, Scopes: tok.Scopes, Token: secret,
					ExpiresAt: optTime(tok.ExpiresAt)}
				enc := json.NewEncoder(g.stdout)
				enc.SetEscapeHTML(false)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			fmt.Fprintln(g.stdout, secret)
			fmt.Fprintf(g.stderr, "sandkeep: created token %s for tenant %s: name %s, scopes %s, expires %s\n",
				tok.ID, cell(tok.Tenant), cell(tok.Name), strings.Join(tok.Scopes, ","), when(tok.ExpiresAt, "never"))
			fmt.Fprintln(g.stderr, "sandkeep: copy the token now: only its hash is stored, it cannot be shown again")
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&tenant, "tenant", "", "the tenant the token belongs to (required)")
	fl.StringVar(&name, "name", "", "a name for the token, unique among the tenant's live tokens, e.g. ci (required)")
	fl.StringVar(&scopes, "scopes", "", "comma-separated scopes: exec, files, read, admin (default exec,files,read)")
	fl.StringVar(&expires, "expires", "never", "lifetime: a number of days, hours or minutes (30d, 12h, 90m; at most 3650d), or never")
	fl.BoolVar(&asJSON, "json", false, "print a JSON object, the token included")
	return cmd
}

// tokenSpec checks the flags of `token create` before the store is opened.
func tokenSpec(cmd *cobra.Command, tenant, name, scopes, expires string) (auth.Spec, error) {
	for _, f := range []struct{ flag, val, example string }{
		{"--tenant", tenant, "--tenant acme"},
		{"--name", name, "--name ci"},
	} {
		if f.val == "" {
			return auth.Spec{}, fault.New(fault.InvalidArgument,
				fmt.Sprintf("pass %s (see '%s --help')", f.example, cmd.CommandPath()), "%s is required", f.flag)
		}
	}
	sc, err := auth.ParseScopes(scopes)
	if err != nil {
		return auth.Spec{}, err
	}
	ttl, err := auth.ParseExpiry(expires)
	if err != nil {
		return auth.Spec{}, err
	}
	return auth.Spec{Tenant: tenant, Name: name, Scopes: sc, TTL: ttl}.Validate()
}

// tokenRow is one token as `token list --json` shows it: never its hash.
type tokenRow struct {
	ID        string     `json:"id"`
	Tenant    string     `json:"tenant"`
	Name      string     `json:"name"`
	Scopes    []string   `json:"scopes"`
	Status    string     `json:"status"` // live, revoked or expired
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"` // null: never
	RevokedAt *time.Time `json:"revoked_at"` // null: not revoked
}

func newTokenList(g *globals) *cobra.Command {
	var (
		asJSON bool
		tenant string
	)
	cmd := &cobra.Command{
		Use:   "list [--tenant T] [--json]",
		Short: "List tokens, oldest first, with their status: live, revoked or expired",
		Long: "list shows every token (or a tenant's): id, tenant, name, scopes, status, when it was created and when\n" +
			"it expires. The tokens themselves are not stored, so they are never shown.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fail := jsonFail(g, asJSON)
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return fail(err)
			}
			defer st.Close()
			toks, err := st.ListTokens(cmd.Context(), tenant)
			if err != nil {
				return fail(storeFault(err, "cannot list the tokens"))
			}
			now := time.Now()
			rows := make([]tokenRow, 0, len(toks))
			for _, t := range toks {
				rows = append(rows, tokenRow{ID: t.ID, Tenant: t.Tenant, Name: t.Name, Scopes: t.Scopes,
					Status: auth.Status(t, now), CreatedAt: t.CreatedAt, ExpiresAt: optTime(t.ExpiresAt),
					RevokedAt: optTime(t.RevokedAt)})
			}
			if asJSON {
				enc := json.NewEncoder(g.stdout)
				enc.SetEscapeHTML(false)
				enc.SetIndent("", "  ")
				return enc.Encode(rows)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTENANT\tNAME\tSCOPES\tSTATUS\tCREATED\tEXPIRES")
			for _, r := range rows {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, cell(r.Tenant), cell(r.Name),
					strings.Join(r.Scopes, ","), r.Status, when(r.CreatedAt, "-"), when(derefTime(r.ExpiresAt), "never"))
			}
			return tw.Flush()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&tenant, "tenant", "", "only this tenant's tokens (default: every tenant's)")
	fl.BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
}

func newTokenRevoke(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a token: the server refuses it from its next request on; prints the id",
		Long: "revoke marks token ID (as 'sandkeep token list' shows it) revoked; the server refuses it from its next\n" +
			"request on. Revoking a revoked token again is not an error. The name of a revoked token is free for a\n" +
			"new one.",
		Example: "  sandkeep token revoke tok_0123456789abcdef",
		Args:    exactlyOneID,
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if !store.ValidTokenID(id) {
				return fault.New(fault.InvalidArgument, "'sandkeep token list' shows the ids of the tokens",
					"%q is not a token id (tok_ and 16 hex digits)", id)
			}
			st, err := g.openStore(cmd.Context())
			if err != nil {
				return err
			}
			defer st.Close()
			if err := st.RevokeToken(cmd.Context(), id); err != nil {
				if errors.Is(err, errdefs.ErrNotFound) {
					return fault.Wrap(err, fault.InvalidArgument, "'sandkeep token list' shows the ids of the tokens",
						"no token %s in this store", id)
				}
				return storeFault(err, "cannot revoke token "+id)
			}
			fmt.Fprintln(g.stdout, id)
			return nil
		},
	}
}

// exactlyOneID is cobra.ExactArgs(1) with sandkeep's error shape.
func exactlyOneID(cmd *cobra.Command, args []string) error {
	if len(args) == 1 {
		return nil
	}
	return fault.New(fault.InvalidArgument, fmt.Sprintf("see '%s --help'", cmd.CommandPath()),
		"%s takes one token id, got %d arguments", cmd.CommandPath(), len(args))
}

// jsonFail returns how a command reports a failure: as JSON on stdout under --json, else as usual.
func jsonFail(g *globals, asJSON bool) func(error) error {
	return func(err error) error {
		if asJSON {
			jsonError(g.stdout, err)
			return exitError{exitFailure}
		}
		return err
	}
}

// storeFault classifies a failure of a store operation that has no better code.
func storeFault(err error, what string) error {
	if fault.CodeOf(err) != "" {
		return err
	}
	return fault.Wrap(err, fault.StoreUnavailable, "check --store (or $SANDKEEP_STORE) and that the store is reachable",
		"%s: %v", what, err)
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func derefTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
