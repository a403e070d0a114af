// Command wicket breaks the rule: it imports test support.
package main

import _ "github.com/wicket-run/wicket/internal/testkit"

func main() {}
