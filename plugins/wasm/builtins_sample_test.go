package wasm

// builtinSamples holds, for every builtin of OPA's table that a policy may
// call, Rego expressions calling it: typical calls, edge cases and calls
// that fail (which both engines must answer as undefined). Arguments come
// from literals or from builtinInput (input.*), which the type checker
// cannot see through, so ill-typed calls reach the builtin.
var builtinSamples = map[string][]string{
	// Arithmetic, comparison, sets: compiled into the module by OPA.
	"abs":                {`abs(input.neg)`, `abs(-1.5)`},
	"plus":               {`input.n + 1`, `input.n + 0.25`},
	"minus":              {`input.n - 7`, `{1, 2, 3} - {2}`},
	"mul":                {`input.n * 3`, `input.n * 1.5`},
	"div":                {`input.n / 2`, `input.n / 0`},
	"rem":                {`input.n % 3`, `input.n % 0`},
	"round":              {`round(2.5)`, `round(input.neg)`},
	"ceil":               {`ceil(1.2)`},
	"floor":              {`floor(-1.2)`},
	"and":                {`{1, 2} & {2, 3}`},
	"or":                 {`{1, 2} | {2, 3}`},
	"equal":              {`input.n == 5`},
	"neq":                {`input.n != 5`},
	"gt":                 {`input.n > 4`},
	"gte":                {`input.s >= "a"`},
	"lt":                 {`input.arr < [4]`},
	"lte":                {`input.n <= 5`},
	"all":                {`all([true, input.n == 5])`},
	"any":                {`any({false, input.n == 5})`},
	"count":              {`count(input.s)`, `count(input.obj)`, `count(input.n)`},
	"sum":                {`sum(input.arr)`, `sum({1.5, 2})`},
	"product":            {`product(input.arr)`},
	"max":                {`max(input.arr)`, `max([])`},
	"min":                {`min({"b", "a"})`},
	"sort":               {`sort(input.arr)`, `sort({"b", "a", "c"})`},
	"intersection":       {`intersection({{1, 2}, {2, 3}})`},
	"union":              {`union({{1}, {2, 3}})`},
	"set_diff":           {`set_diff({1, 2}, {2})`},
	"bits.and":           {`bits.and(input.n, 3)`},
	"bits.or":            {`bits.or(input.n, 8)`},
	"bits.xor":           {`bits.xor(input.n, 1)`},
	"bits.negate":        {`bits.negate(input.n)`},
	"bits.lsh":           {`bits.lsh(input.n, 2)`},
	"bits.rsh":           {`bits.rsh(input.n, 1)`},
	"numbers.range":      {`numbers.range(1, input.n)`, `numbers.range(input.n, 1)`},
	"numbers.range_step": {`numbers.range_step(0, 10, 3)`, `numbers.range_step(0, 10, 0)`},
	"to_number":          {`to_number("12.5")`, `to_number(input.bad)`, `to_number(true)`, `to_number(null)`},
	"format_int":         {`format_int(input.n, 2)`, `format_int(255, 16)`},

	// Arrays and objects.
	"array.concat":    {`array.concat(input.arr, [9])`},
	"array.flatten":   {`array.flatten([[1, [2]], 3])`},
	"array.reverse":   {`array.reverse(input.arr)`},
	"array.slice":     {`array.slice(input.arr, 1, 5)`, `array.slice(input.arr, 2, 1)`},
	"object.get":      {`object.get(input.obj, "a", 0)`, `object.get(input.obj, ["b", 1], "none")`, `object.get(input.obj, "zz", "none")`},
	"object.keys":     {`object.keys(input.obj)`},
	"object.remove":   {`object.remove(input.obj, ["a"])`},
	"object.filter":   {`object.filter(input.obj, {"b"})`},
	"object.union":    {`object.union(input.obj, {"a": {"x": 1}, "c": 3})`},
	"object.union_n":  {`object.union_n([{"a": 1}, {"a": 2, "b": 1}])`},
	"object.subset":   {`object.subset(input.obj, {"a": 1})`, `object.subset([1, 2, 3], [2, 3])`, `object.subset({1, 2}, {3})`},
	"json.filter":     {`json.filter(input.obj, ["b/0"])`},
	"json.remove":     {`json.remove(input.obj, ["b"])`},
	"json.patch":      {`json.patch(input.obj, [{"op": "add", "path": "/c", "value": 3}, {"op": "remove", "path": "/a"}])`, `json.patch(input.obj, [{"op": "test", "path": "/a", "value": 2}])`},
	"walk":            {`{p | walk(input.obj, [p, _])}`},
	"graph.reachable": {`graph.reachable({"a": ["b"], "b": ["c"], "c": []}, ["a"])`},
	"graph.reachable_paths": {
		`graph.reachable_paths({"a": ["b"], "b": ["c"], "c": []}, {"a"})`,
		// A chain of 30 roles has one path, however many nodes it has;
		// cycles and nodes outside the graph end a path, as in OPA.
		`graph.reachable_paths({sprintf("r%02d", [i]): [sprintf("r%02d", [i + 1])] | some i in numbers.range(0, 29)}, ["r00", "r29"])`,
		`graph.reachable_paths({"a": ["b", "a"], "b": {"c", "a"}, "c": ["zz"]}, {"a", "c"})`,
	},
	"internal.member_2": {`input.n in input.arr`, `3 in input.arr`},
	"internal.member_3": {`[true | "a", 1 in input.obj]`},

	// Types.
	"is_number":    {`is_number(input.n)`, `is_number(input.s)`},
	"is_string":    {`is_string(input.s)`},
	"is_boolean":   {`is_boolean(true)`},
	"is_array":     {`is_array(input.arr)`},
	"is_set":       {`is_set({1})`},
	"is_object":    {`is_object(input.obj)`},
	"is_null":      {`is_null(null)`},
	"type_name":    {`type_name(input.obj)`, `type_name({1})`},
	"cast_array":   {`cast_array({1, 2})`},
	"cast_boolean": {`cast_boolean(true)`},
	"cast_null":    {`cast_null(null)`},
	"cast_object":  {`cast_object(input.obj)`},
	"cast_set":     {`cast_set([1, 1, 2])`},
	"cast_string":  {`cast_string("s")`},

	// Strings.
	"concat":      {`concat(", ", input.words)`, `concat("-", {"b", "a"})`},
	"contains":    {`contains(input.s, "ell")`},
	"endswith":    {`endswith(input.s, "lo")`},
	"startswith":  {`startswith(input.s, "he")`},
	"indexof":     {`indexof(input.s, "l")`, `indexof("héllo", "l")`},
	"indexof_n":   {`indexof_n(input.s, "l")`},
	"lower":       {`lower("ÀB")`},
	"upper":       {`upper(input.s)`},
	"replace":     {`replace(input.s, "l", "L")`},
	"split":       {`split("a,b,,c", ",")`},
	"substring":   {`substring(input.s, 1, 3)`, `substring("héllo", 1, -1)`, `substring(input.s, 9, 1)`},
	"trim":        {`trim("xxhixx", "x")`},
	"trim_left":   {`trim_left("xxhi", "x")`},
	"trim_prefix": {`trim_prefix(input.s, "he")`},
	"trim_right":  {`trim_right("hixx", "x")`},
	"trim_suffix": {`trim_suffix(input.s, "lo")`},
	"trim_space":  {`trim_space("  hi \t")`},
	"sprintf": {
		`sprintf("%s has %d items costing %.2f", [input.s, input.n, 1.234])`,
		`sprintf("%v and %v", [input.obj, {1, 2}])`,
		`sprintf("%q %x %5s|", [input.s, 255, "ab"])`,
		`sprintf("%d", [input.bad])`,
		`sprintf("%s", input.s)`,
		// Numbers are not widths: a timestamp in nanoseconds or a big
		// integer prints as OPA prints it. Go's fmt ignores widths over
		// 10^6 (%!(NOVERB), %!(BADWIDTH)), so these are small answers too.
		`sprintf("at %d ns, %v", [1764403809123456789, 100000000000000000000001])`,
		`sprintf("%999999999d|%*d", [1, 999999999, 2])`,
	},
	"strings.any_prefix_match": {`strings.any_prefix_match(input.s, ["x", "he"])`, `strings.any_prefix_match({"a", "b"}, "c")`},
	"strings.any_suffix_match": {`strings.any_suffix_match(["hello", "x"], "lo")`},
	"strings.count":            {`strings.count(input.s, "l")`},
	"strings.render_template": {
		`strings.render_template("Hi {{.name}}, {{.n}}", {"name": input.s, "n": input.n})`, `strings.render_template("{{.missing.x}}", {})`,
		// A table of 100 rows of 20 cells renders to 80 KB: nested
		// ranges over data of this size are within the sandbox's bound.
		`count(strings.render_template("{{range .rows}}{{range .}}{{.}},{{end}}\n{{end}}", {"rows": [[sprintf("cell %03d-%02d aaaaaaaaaaaaaaaaaaaaa", [r, c]) | some c in numbers.range(1, 20)] | some r in numbers.range(1, 100)]}))`,
	},
	"strings.replace_n":        {`strings.replace_n({"l": "1", "o": "0"}, input.s)`},
	"strings.reverse":          {`strings.reverse("héllo")`},
	"strings.split_n":          {`strings.split_n("a,b,c", ",", 2)`},
	"internal.template_string": {`$"{input.s} is {input.n}"`},

	// Regular expressions and globs.
	"regex.match":                      {`regex.match("^h.*o$", input.s)`, `regex.match("[", input.s)`, `regex.match("^a", input.n)`},
	"re_match":                         {`re_match("l+", input.s)`},
	"regex.is_valid":                   {`regex.is_valid("a(b")`, `regex.is_valid("a+")`},
	"regex.find_all_string_submatch_n": {`regex.find_all_string_submatch_n("(l)(.)", input.s, -1)`},
	"regex.find_n":                     {`regex.find_n("l.", "hello world", -1)`, `regex.find_n("o", input.s, 1)`},
	"regex.globs_match":                {`regex.globs_match("a.+", "a.*b")`, `regex.globs_match("[a-c]", "d")`},
	"regex.replace": {
		`regex.replace(input.s, "l+", "L")`, `regex.replace("a-b-c", "-(.)", "${1}")`,
		// Redacting a 6 KB text keeps it 6 KB: a reference repeats part
		// of its own match, not the whole text.
		`count(regex.replace(concat("", ["set password = 'hunter2'; " | some _ in numbers.range(1, 240)]), "(password = )'[^']*'", "${1}'***'"))`,
	},
	"regex.split":          {`regex.split("[,;]", "a,b;c")`},
	"regex.template_match": {`regex.template_match("urn:foo:{.*}", "urn:foo:bar:baz", "{", "}")`, `regex.template_match("urn:{[a-z]+}", "urn:ABC", "{", "}")`},
	"glob.match":           {`glob.match("fs.read*", ["."], "fs.read_file")`, `glob.match("*.exec", ["."], "shell.sub.exec")`, `glob.match("**.exec", ["."], "shell.sub.exec")`, `glob.match("{a,b}*", null, "bz")`, `glob.match("[", null, "x")`},
	"glob.quote_meta":      {`glob.quote_meta("*.{a,b}?")`},

	// Encodings.
	"base64.encode":             {`base64.encode(input.s)`},
	"base64.decode":             {`base64.decode("aGVsbG8=")`, `base64.decode("!!")`},
	"base64.is_valid":           {`base64.is_valid("aGVsbG8=")`},
	"base64url.encode":          {`base64url.encode("\u00ff?")`},
	"base64url.encode_no_pad":   {`base64url.encode_no_pad(input.s)`},
	"base64url.decode":          {`base64url.decode("aGVsbG8")`},
	"hex.encode":                {`hex.encode(input.s)`},
	"hex.decode":                {`hex.decode("68656c6c6f")`, `hex.decode("zz")`},
	"json.marshal":              {`json.marshal(input.obj)`, `json.marshal({1, 2})`},
	"json.marshal_with_options": {`json.marshal_with_options(input.obj, {"pretty": true, "indent": "  "})`},
	"json.unmarshal":            {`json.unmarshal("{\"a\": [1, 2.5]}")`, `json.unmarshal(input.bad)`},
	"json.is_valid":             {`json.is_valid("[1,")`, `json.is_valid("{}")`},
	"yaml.marshal":              {`yaml.marshal(input.obj)`},
	"yaml.unmarshal":            {`yaml.unmarshal("a: 1\nb: [x, y]\n")`, `yaml.unmarshal(":")`},
	"yaml.is_valid":             {`yaml.is_valid("a: [")`},
	"urlquery.encode":           {`urlquery.encode("a b&c")`},
	"urlquery.decode":           {`urlquery.decode("a+b%26c")`, `urlquery.decode("%zz")`},
	"urlquery.encode_object":    {`urlquery.encode_object({"a": "1", "b": ["x", "y"], "c": {"z"}})`},
	"urlquery.decode_object":    {`urlquery.decode_object("a=1&b=x&b=y")`},

	// Time. input.ts is an RFC 3339 timestamp, as input.execution.created_at.
	"time.parse_rfc3339_ns":  {`time.parse_rfc3339_ns(input.ts)`, `time.parse_rfc3339_ns("2026-02-30T00:00:00Z")`, `time.parse_rfc3339_ns(input.bad)`},
	"time.parse_ns":          {`time.parse_ns("2006-01-02", "2026-11-29")`, `time.parse_ns("RFC822", "29 Nov 26 08:10 UTC")`},
	"time.parse_duration_ns": {`time.parse_duration_ns("1h30m")`, `time.parse_duration_ns("1 day")`},
	"time.date":              {`time.date(time.parse_rfc3339_ns(input.ts))`, `time.date([0, "Asia/Tokyo"])`},
	"time.clock":             {`time.clock(time.parse_rfc3339_ns(input.ts))`, `time.clock([0, "Nowhere/Land"])`},
	"time.weekday":           {`time.weekday(time.parse_rfc3339_ns(input.ts))`},
	"time.add_date":          {`time.add_date(time.parse_rfc3339_ns(input.ts), 0, 1, 2)`},
	"time.diff":              {`time.diff(time.parse_rfc3339_ns(input.ts), 0)`},
	"time.format":            {`time.format(time.parse_rfc3339_ns(input.ts))`, `time.format([0, "Europe/Paris", "2006-01-02 15:04 MST"])`},

	// Networks, URIs, versions, units.
	"net.cidr_contains":         {`net.cidr_contains("10.0.0.0/8", input.ip)`, `net.cidr_contains("10.0.0.0/8", "bad")`},
	"net.cidr_intersects":       {`net.cidr_intersects("10.0.0.0/8", "10.1.0.0/16")`},
	"net.cidr_overlap":          {`net.cidr_overlap("192.168.0.0/16", "192.168.1.1")`},
	"net.cidr_is_valid":         {`net.cidr_is_valid("10.0.0.0/33")`},
	"net.cidr_expand":           {`net.cidr_expand("192.168.1.0/30")`},
	"net.cidr_merge":            {`net.cidr_merge(["192.0.128.0/24", "192.0.129.0/24"])`},
	"net.cidr_contains_matches": {`net.cidr_contains_matches({"x": "10.0.0.0/8"}, [input.ip, "11.0.0.1"])`},
	"uri.parse":                 {`uri.parse("https://user@example.com:8443/p/a?q=1#f")`},
	"uri.is_valid":              {`uri.is_valid("http://[::1")`},
	"semver.compare":            {`semver.compare("1.2.3", "1.10.0")`, `semver.compare("x", "1.0.0")`},
	"semver.is_valid":           {`semver.is_valid("1.0.0-rc.1")`, `semver.is_valid(input.n)`},
	"units.parse":               {`units.parse("1.5K")`, `units.parse("10m")`},
	"units.parse_bytes":         {`units.parse_bytes("1KiB")`, `units.parse_bytes("2GB")`, `units.parse_bytes("x")`},
	"uuid.parse":                {`uuid.parse("00000000-0000-4000-8000-000000000000")`},

	// Cryptography. The PEM inputs and tokens are made by the test.
	"crypto.md5":                            {`crypto.md5(input.s)`},
	"crypto.sha1":                           {`crypto.sha1(input.s)`},
	"crypto.sha256":                         {`crypto.sha256(input.s)`},
	"crypto.hmac.md5":                       {`crypto.hmac.md5(input.s, "k")`},
	"crypto.hmac.sha1":                      {`crypto.hmac.sha1(input.s, "k")`},
	"crypto.hmac.sha256":                    {`crypto.hmac.sha256(input.s, "k")`},
	"crypto.hmac.sha512":                    {`crypto.hmac.sha512(input.s, "k")`},
	"crypto.hmac.equal":                     {`crypto.hmac.equal("a", "a")`},
	"crypto.x509.parse_certificates":        {`[c.Subject.CommonName | some c in crypto.x509.parse_certificates(input.cert)]`, `crypto.x509.parse_certificates("nope")`},
	"crypto.x509.parse_certificate_request": {`crypto.x509.parse_certificate_request(input.csr).Subject.CommonName`},
	"crypto.x509.parse_keypair":             {`is_object(crypto.x509.parse_keypair(input.cert, input.key))`},
	"crypto.x509.parse_rsa_private_key":     {`object.keys(crypto.x509.parse_rsa_private_key(input.rsa))`},
	"crypto.parse_private_keys":             {`count(crypto.parse_private_keys(input.key))`},
	"io.jwt.decode":                         {`io.jwt.decode(input.jwt_hs)`, `io.jwt.decode("a.b")`},
	"io.jwt.verify_hs256":                   {`io.jwt.verify_hs256(input.jwt_hs, "secret")`, `io.jwt.verify_hs256(input.jwt_hs, "wrong")`},
	"io.jwt.verify_hs384":                   {`io.jwt.verify_hs384(input.jwt_hs, "secret")`},
	"io.jwt.verify_hs512":                   {`io.jwt.verify_hs512(input.jwt_hs, "secret")`},
	"io.jwt.verify_es256":                   {`io.jwt.verify_es256(input.jwt_es, input.cert)`, `io.jwt.verify_es256(input.jwt_hs, input.cert)`},
	"io.jwt.verify_es384":                   {`io.jwt.verify_es384(input.jwt_es, input.cert)`},
	"io.jwt.verify_es512":                   {`io.jwt.verify_es512(input.jwt_es, input.cert)`},
	"io.jwt.verify_rs256":                   {`io.jwt.verify_rs256(input.jwt_hs, input.cert)`},
	"io.jwt.verify_rs384":                   {`io.jwt.verify_rs384(input.jwt_hs, input.cert)`},
	"io.jwt.verify_rs512":                   {`io.jwt.verify_rs512(input.jwt_hs, input.cert)`},
	"io.jwt.verify_ps256":                   {`io.jwt.verify_ps256(input.jwt_hs, input.cert)`},
	"io.jwt.verify_ps384":                   {`io.jwt.verify_ps384(input.jwt_hs, input.cert)`},
	"io.jwt.verify_ps512":                   {`io.jwt.verify_ps512(input.jwt_hs, input.cert)`},
	"io.jwt.verify_eddsa":                   {`io.jwt.verify_eddsa(input.jwt_hs, input.cert)`},
	"providers.aws.sign_req": {
		`providers.aws.sign_req({"method": "GET", "url": "https://example.com/x", "headers": {}}, {"aws_access_key": "AK", "aws_secret_access_key": "SK", "aws_service": "s3", "aws_region": "us-east-1"}, 1700000000000)`,
	},

	// GraphQL and Rego.
	"graphql.parse_query":      {`count(graphql.parse_query("{ a { b } }").Operations)`, `graphql.parse_query("{")`},
	"graphql.parse_schema":     {`count(graphql.parse_schema("type Query { a: Int }").Definitions)`},
	"graphql.schema_is_valid":  {`graphql.schema_is_valid("type Query { a: Int }")`},
	"graphql.is_valid":         {`graphql.is_valid("{ a }", "type Query { a: Int }")`, `graphql.is_valid("{ b }", "type Query { a: Int }")`},
	"graphql.parse":            {`count(graphql.parse("{ a }", "type Query { a: Int }"))`},
	"graphql.parse_and_verify": {`graphql.parse_and_verify("{ a }", "type Query { a: Int }")[0]`},
	"rego.parse_module":        {`rego.parse_module("p.rego", "package p\nx := 1\n").package.path[1].value`},
	"rego.metadata.chain":      {`count(rego.metadata.chain())`},
	"rego.metadata.rule":       {`rego.metadata.rule()`},
	"trace":                    {`trace(input.s)`},
}

// builtinsCompiledAway are OPA builtins a policy never calls at
// evaluation: the compiler rewrites them (to unification, or print to
// internal.print) or only OPA's test runner uses them.
var builtinsCompiledAway = map[string]string{
	"assign":             "compiled to unification",
	"eq":                 "compiled to unification",
	"print":              "rewritten to internal.print (see TestOPAPrint)",
	"internal.print":     "print statements are compiled out of policies unless enabled (see TestOPAPrint)",
	"internal.test_case": "only OPA's test runner calls it",
}

// builtinDifferences are sample calls on which OPA's wasm and OPA's
// topdown answer differently. Both are builtins OPA compiles into the
// module, so the difference is OPA's own (docs/policy.md lists them).
var builtinDifferences = map[string]string{
	`concat("-", {"b", "a"})`: "the module joins a set in its own order (insertion); topdown joins it sorted",
	`json.marshal(input.obj)`: "the module writes object keys in their order in the document; topdown sorts them",
}
