package policy

// What the external tests reach that users do not: the hint parsers and
// their bound are the policy's own business (the ABI and the hosts pass
// the raw header value).
var ParseRetryAfter = parseRetryAfter

const MaxHintMs = maxHintMs
