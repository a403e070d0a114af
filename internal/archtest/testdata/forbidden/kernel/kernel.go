// Package kernel breaks the rule: it imports server/wire.
package kernel

import _ "github.com/wicket-run/wicket/server/wire"
