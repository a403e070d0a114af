// Package agent breaks the rule: it imports the kernel.
package agent

import _ "github.com/wicket-run/wicket/kernel"
