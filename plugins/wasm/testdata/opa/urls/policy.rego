# Outbound URLs: parsed with uri.parse, hosts matched against data, private
# addresses refused with net.cidr_contains, queries decoded.
package wicket

import rego.v1

url := input.step.args.url if is_string(input.step.args.url)

u := uri.parse(url)

host := u.hostname

query := urlquery.decode_object(object.get(u, "raw_query", ""))

private if {
	regex.match(`^[0-9.]+$`, host)
	some c in data.private_cidrs
	net.cidr_contains(c, host)
}

decision := {"decision": "deny", "rule_id": "scheme", "reason": sprintf("scheme %s", [u.scheme])} if {
	not u.scheme in {"http", "https"}
} else := {"decision": "deny", "rule_id": "private", "reason": sprintf("%s is a private address", [host])} if {
	private
} else := {"decision": "deny", "rule_id": "token-in-query", "reason": "credentials in the query string"} if {
	some k, _ in query
	lower(k) in {"token", "apikey", "api_key", "password"}
} else := {"decision": "allow", "rule_id": "known-host", "reason": sprintf("%s (%s)", [host, glob.quote_meta(object.get(u, "path", ""))])} if {
	some d in data.domains
	glob.match(d, ["."], host)
}
