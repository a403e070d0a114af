package llmgw

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/wicket-run/wicket/kernel"
)

// Dialects: the provider APIs the gateway speaks.
const (
	// DialectOpenAI is OpenAI's API: POST /v1/chat/completions,
	// /v1/responses and /v1/embeddings.
	DialectOpenAI = "openai"
	// DialectAnthropic is Anthropic's API: POST /v1/messages.
	DialectAnthropic = "anthropic"
)

// Default upstream base URLs, as the providers' own SDKs default them.
const (
	DefaultOpenAIBaseURL    = "https://api.openai.com/v1"
	DefaultAnthropicBaseURL = "https://api.anthropic.com"
)

// Ceilings of a provider configuration.
const (
	maxProviders      = 64   // per tenant
	maxModels         = 1024 // per provider
	maxModelNameBytes = 256
)

// Provider is an upstream the operator configured for one tenant: where
// the tenant's model calls of one dialect go, with which key, for which
// models, at what price. It comes from the provisioning manifest; the key
// is held in memory only and never recorded, logged or returned.
type Provider struct {
	// Name names the provider in logs and errors (unique per tenant).
	Name string
	// Tenant is the tenant whose agents may use it.
	Tenant string
	// Dialect is DialectOpenAI or DialectAnthropic.
	Dialect string
	// BaseURL is the upstream base URL, as the provider's SDK takes it
	// (default DefaultOpenAIBaseURL or DefaultAnthropicBaseURL): the
	// gateway appends the path after /llm/openai/v1 (OpenAI) or after
	// /llm/anthropic (Anthropic).
	BaseURL string
	// APIKey is the provider key, sent as Authorization: Bearer (OpenAI)
	// or x-api-key (Anthropic). Empty sends none (a local server).
	APIKey string
	// Models are the models the tenant may call through it, with their
	// prices.
	Models []Model
	// IdempotencyHeader names the request header that carries the step id
	// to the provider (default "Idempotency-Key" for OpenAI, none for
	// Anthropic; "-" sends none).
	IdempotencyHeader string
}

// Model is an allowed model and its price in USD per million tokens; a
// step's cost_usd is input_tokens × Input + output_tokens × Output,
// divided by one million.
type Model struct {
	Name   string
	Input  float64
	Output float64
}

// String names a provider without its key.
func (p *Provider) String() string { return p.Tenant + "/" + p.Name + " (" + p.Dialect + ")" }

// Validate checks a provider and fills its defaults.
func (p *Provider) Validate() error {
	if p.Tenant == "" {
		p.Tenant = kernel.DefaultTenant
	}
	if !kernel.ValidID(p.Name) {
		return fmt.Errorf("provider name %q is invalid", p.Name)
	}
	if !kernel.ValidID(p.Tenant) {
		return fmt.Errorf("provider %s: tenant %q is invalid", p.Name, p.Tenant)
	}
	switch p.Dialect {
	case DialectOpenAI:
		if p.BaseURL == "" {
			p.BaseURL = DefaultOpenAIBaseURL
		}
		if p.IdempotencyHeader == "" {
			p.IdempotencyHeader = "Idempotency-Key"
		}
	case DialectAnthropic:
		if p.BaseURL == "" {
			p.BaseURL = DefaultAnthropicBaseURL
		}
	default:
		return fmt.Errorf("provider %s: dialect %q is invalid (want openai or anthropic)", p.Name, p.Dialect)
	}
	if p.IdempotencyHeader == "-" {
		p.IdempotencyHeader = ""
	}
	if p.IdempotencyHeader != "" && !validHeaderName(p.IdempotencyHeader) {
		return fmt.Errorf("provider %s: idempotency_header %q is not a header name", p.Name, p.IdempotencyHeader)
	}
	u, err := url.Parse(p.BaseURL)
	switch {
	case err != nil:
		return fmt.Errorf("provider %s: base_url: %w", p.Name, err)
	case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("provider %s: base_url %q must be an absolute http or https URL", p.Name, p.BaseURL)
	case u.User != nil:
		return fmt.Errorf("provider %s: base_url must not hold credentials (give the key with api_key_env or api_key_file)", p.Name)
	case u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("provider %s: base_url must not have a query or fragment", p.Name)
	}
	p.BaseURL = strings.TrimRight(p.BaseURL, "/")
	if strings.ContainsAny(p.APIKey, "\r\n") {
		return fmt.Errorf("provider %s: the API key holds a line break", p.Name)
	}
	if len(p.Models) == 0 {
		return fmt.Errorf("provider %s: models must list at least one model", p.Name)
	}
	if len(p.Models) > maxModels {
		return fmt.Errorf("provider %s: more than %d models", p.Name, maxModels)
	}
	seen := map[string]bool{}
	for _, m := range p.Models {
		switch {
		case m.Name == "" || len(m.Name) > maxModelNameBytes || len(m.Name) > kernel.MaxTargetLen:
			return fmt.Errorf("provider %s: model name %q must be 1 to %d bytes", p.Name, m.Name, maxModelNameBytes)
		case seen[m.Name]:
			return fmt.Errorf("provider %s: model %s is listed twice", p.Name, m.Name)
		case m.Input < 0 || m.Output < 0 || m.Input != m.Input || m.Output != m.Output:
			return fmt.Errorf("provider %s: model %s: prices must be non-negative numbers", p.Name, m.Name)
		}
		seen[m.Name] = true
	}
	return nil
}

func validHeaderName(s string) bool {
	return s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r)
	}) && http.CanonicalHeaderKey(s) != ""
}

// routes maps tenant → dialect → model → where it goes.
type routes map[string]map[string]map[string]route

type route struct {
	p *Provider
	m Model
}

// buildRoutes validates providers and indexes their models. A model may
// be offered by one provider per tenant and dialect.
func buildRoutes(ps []Provider) (routes, error) {
	out := routes{}
	names := map[string]bool{}
	perTenant := map[string]int{}
	for i := range ps {
		p := &ps[i]
		if err := p.Validate(); err != nil {
			return nil, err
		}
		if names[p.Tenant+"\x00"+p.Name] {
			return nil, fmt.Errorf("provider %s is configured twice in tenant %s", p.Name, p.Tenant)
		}
		names[p.Tenant+"\x00"+p.Name] = true
		if perTenant[p.Tenant]++; perTenant[p.Tenant] > maxProviders {
			return nil, fmt.Errorf("tenant %s: more than %d providers", p.Tenant, maxProviders)
		}
		if out[p.Tenant] == nil {
			out[p.Tenant] = map[string]map[string]route{}
		}
		if out[p.Tenant][p.Dialect] == nil {
			out[p.Tenant][p.Dialect] = map[string]route{}
		}
		for _, m := range p.Models {
			if prev, ok := out[p.Tenant][p.Dialect][m.Name]; ok {
				return nil, fmt.Errorf("tenant %s: model %s is offered by providers %s and %s (one provider per model and dialect)", p.Tenant, m.Name, prev.p.Name, p.Name)
			}
			out[p.Tenant][p.Dialect][m.Name] = route{p: p, m: m}
		}
	}
	return out, nil
}

// models lists the models a tenant may call in a dialect, sorted.
func (r routes) models(tenant, dialect string) []string {
	var out []string
	for m := range r[tenant][dialect] {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

var errNoProviders = errors.New("no LLM provider is configured")
