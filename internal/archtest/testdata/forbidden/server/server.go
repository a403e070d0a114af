// Package server breaks the rule: it imports the engines.
package server

import _ "github.com/wicket-run/wicket/plugins"
