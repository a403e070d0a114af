package main

import (
	"flag"
	"io"
	"os"
	"strconv"
	"strings"
)

// envName is the environment twin of a serve flag: WICKET_ and the flag's
// name in upper case, dashes as underscores (--max-body: WICKET_MAX_BODY).
func envName(flagName string) string {
	return "WICKET_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// envBool reads a boolean twin as strconv.ParseBool does (1, t, true, ...),
// keeping def when the variable is unset or invalid; checkEnvTwins refuses
// an invalid one.
func envBool(name string, def bool) bool {
	if v, ok := os.LookupEnv(name); ok {
		if b, err := strconv.ParseBool(v); err == nil {
			return b
		}
	}
	return def
}

// checkEnvTwins refuses a set WICKET_* twin whose value its flag would
// refuse on the command line. The twins are read as the flags' defaults,
// where a bad value could only be dropped in silence (WICKET_RETENTION=30days
// would keep every execution forever). Flags given on the command line
// replace their twins and are not checked. scratch returns a flag set of
// the same flags over throwaway options, on which each value is tried.
func checkEnvTwins(fs *flag.FlagSet, scratch func() *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	try := scratch()
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if e := try.Set(f.Name, v); e != nil {
			err = usagef("%s=%q: not a valid value for --%s: %v", envName(f.Name), v, f.Name, e)
		}
	})
	return err
}

// scratchServeFlags is the scratch flag set of serve's flags.
func scratchServeFlags() *flag.FlagSet {
	var o serveOptions
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	serveFlags(&o, fs)
	return fs
}
