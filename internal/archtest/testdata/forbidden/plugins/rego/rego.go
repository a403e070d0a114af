// Package rego breaks the rule: the dependency it may import (OPA) links
// testing through OPA's test runner, so the binary would too.
package rego

import _ "github.com/open-policy-agent/opa/v1/tester"
