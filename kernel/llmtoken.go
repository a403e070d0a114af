package kernel

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// LLM gateway tokens (docs/llm-gateway.md). With Config.LLMGatewayTokens,
// every claimed dispatch attempt gets a token that the webhook hands to
// the agent: the agent's model client sends it to the gateway instead of a
// provider key. A token is
//
//	wkg1.<execution id>.<43 characters: 32 random bytes, base64url>
//
// Only its SHA-256 is stored, in a counter of the execution's tenant, with
// the lease it was issued for; it authenticates as long as that lease is
// the execution's current one, so it ends when the attempt is superseded,
// its lease expires, or the execution is dispatched anew.

// llmTokenPrefix starts every gateway token.
const llmTokenPrefix = "wkg1."

// llmTokenKey is the counter key of an execution's gateway token. It
// starts with "exec\x00<id>\x00", the prefix of the counters that belong
// to one execution.
func llmTokenKey(executionID string) string { return "exec\x00" + executionID + "\x00llm_token" }

// llmTokenRecord is what is stored of a token.
type llmTokenRecord struct {
	Hash  []byte `json:"sha256"`
	Lease Lease  `json:"lease"`
}

// issueLLMToken makes the token of e's current lease and stores its hash.
func issueLLMToken(tx Tx, e *Execution) (string, error) {
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return "", fmt.Errorf("gateway token: %w", err)
	}
	tok := llmTokenPrefix + e.ID + "." + base64.RawURLEncoding.EncodeToString(secret[:])
	h := sha256.Sum256([]byte(tok))
	b, err := json.Marshal(llmTokenRecord{Hash: h[:], Lease: e.Lease})
	if err != nil {
		return "", err
	}
	if err := tx.PutCounter(e.Tenant, llmTokenKey(e.ID), b); err != nil {
		return "", fmt.Errorf("put gateway token: %w", err)
	}
	return tok, nil
}

// LLMTokenExecution returns the execution id a gateway token names, or ""
// when tok does not have a token's shape.
func LLMTokenExecution(tok string) string {
	rest, ok := strings.CutPrefix(tok, llmTokenPrefix)
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(rest, '.')
	if i < 0 || !ValidID(rest[:i]) || len(rest)-i-1 != 43 {
		return ""
	}
	return rest[:i]
}

// GatewayCall is what a valid gateway token stands for: the agent call it
// may make (tenant, execution, agent, the lease it was issued for) and the
// execution's limits.
type GatewayCall struct {
	AgentCall
	Limits Limits
}

// AuthenticateLLMToken checks a gateway token: its hash against the one
// stored for its execution, in constant time, and its lease against the
// execution's current lease. Any failure is CodeUnauthenticated, with no
// hint of whether the execution exists.
func (k *Kernel) AuthenticateLLMToken(ctx context.Context, tok string) (*GatewayCall, error) {
	bad := func(why string) error { return Errorf(CodeUnauthenticated, "invalid gateway token: %s", why) }
	id := LLMTokenExecution(tok)
	if id == "" {
		return nil, bad("not a gateway token (wkg1.<execution id>.<secret>)")
	}
	tenant, agentID, err := k.ExecutionOwner(ctx, id)
	if err != nil {
		if CodeOf(err) == CodeNotFound {
			return nil, bad("unknown or expired")
		}
		return nil, err
	}
	var out *GatewayCall
	err = k.store.View(ctx, func(tx ReadTx) error {
		e, err := tx.Execution(tenant, id)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return bad("unknown or expired")
			}
			return fmt.Errorf("read execution %s: %w", id, err)
		}
		raw, err := tx.Counter(tenant, llmTokenKey(id))
		if err != nil {
			return fmt.Errorf("read gateway token: %w", err)
		}
		var rec llmTokenRecord
		if len(raw) == 0 || json.Unmarshal(raw, &rec) != nil {
			return bad("unknown or expired")
		}
		h := sha256.Sum256([]byte(tok))
		if subtle.ConstantTimeCompare(h[:], rec.Hash) != 1 {
			return bad("unknown or expired")
		}
		if rec.Lease != e.Lease || e.Lease.DispatchID == "" {
			return bad("its dispatch attempt is over (the token expires with its lease)")
		}
		out = &GatewayCall{AgentCall: AgentCall{Tenant: tenant, ExecutionID: id, AgentID: agentID, Lease: e.Lease}, Limits: e.Limits}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
