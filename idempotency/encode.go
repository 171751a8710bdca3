package idempotency

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// A stored response is text every adapter reads the same way: the headers
// as a JSON object of name → list of values, the body in standard base64
// (binary bodies survive every Redis client's string replies).
func encodeStored(h map[string][]string, body []byte) (string, string) {
	if h == nil {
		h = map[string][]string{}
	}
	j, _ := json.Marshal(h)
	return string(j), base64.StdEncoding.EncodeToString(body)
}

// decodeStored reads a stored response back; the headers as SafeHeader has
// them (a record stored before the rule may hold any).
func decodeStored(headers, body string) (map[string][]string, []byte, error) {
	h := map[string][]string{}
	if headers != "" {
		if err := json.Unmarshal([]byte(headers), &h); err != nil {
			return nil, nil, fmt.Errorf("stored headers are not a JSON object of lists: %w", err)
		}
	}
	b, err := base64.StdEncoding.DecodeString(body)
	if err != nil {
		return nil, nil, fmt.Errorf("stored body is not base64: %w", err)
	}
	return safeHeaders(h, nil), b, nil
}
