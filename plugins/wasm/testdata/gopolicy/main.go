// Command gopolicy is the Go SDK policy the plugins/wasm tests run. Besides
// ordinary rules it misbehaves on request (by step target) so the tests can
// check that the sandbox contains it.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"

	"github.com/wicket-run/wicket/policy-sdk/go/policy"
)

var hoard [][]byte

func init() {
	policy.Handle(func(in *policy.Input) *policy.Decision {
		s := &in.Step
		switch s.Target {
		case "test.panic":
			panic("asked to panic")
		case "test.loop":
			for {
			}
		case "test.bomb":
			for {
				hoard = append(hoard, make([]byte, 1<<20))
			}
		case "test.clock":
			return policy.Allow(time.Now().UTC().Format(time.RFC3339Nano)).WithRule("clock")
		case "test.random":
			b := make([]byte, 8)
			_, _ = rand.Read(b)
			return policy.Allow(hex.EncodeToString(b)).WithRule("random")
		case "test.env":
			return policy.Allow("env=" + os.Getenv("WICKET_TEST")).WithRule("env")
		case "test.print":
			fmt.Println("hello from the policy")
			return policy.Allow("printed").WithRule("print")
		case "test.file":
			_, err := os.ReadFile("/etc/passwd")
			return policy.Deny(fmt.Sprint(err)).WithRule("file")
		case "test.exit":
			os.Exit(3)
		}
		switch {
		case s.Effect == policy.EffectDestructive:
			return policy.Deny("destructive steps are not allowed").WithRule("no-destructive")
		case s.Kind == policy.KindToolCall && s.Target == "shell.exec":
			if cmd, _ := s.StringArg("cmd"); len(cmd) >= 3 && cmd[:3] == "rm " {
				return policy.RequireApproval("shell command removes files").WithRule("shell-rm").
					WithApproval(policy.Approval{Approvers: []string{"ops"}, Timeout: "15m"})
			}
			return policy.Allow("shell command").WithRule("shell")
		case s.Kind == policy.KindLLMCall:
			return policy.Allow("llm call").WithRule("llm").
				WithRateLimit(policy.RateLimit{MaxCalls: 100, Window: "1m", Per: policy.PerAgent})
		case s.Effect == policy.EffectReadOnly:
			return policy.Allow("read-only step").WithRule("read-only")
		}
		return nil
	})
}

func main() {}

//lint:file-ignore SA5002 the endless loop is the point: it is the hostile policy the sandbox tests stop
