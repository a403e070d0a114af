// Package testkit keeps the rules: test support may import testing.
package testkit

import _ "testing"
