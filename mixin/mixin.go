// Package mixin writes backstop's rules and dashboards as a monitoring
// mixin, mixin.libsonnet: the format Prometheus users import with
// jsonnet-bundler and render with their own configuration,
//
//	local backstop = (import 'mixin.libsonnet') + {
//	  _config+:: { selector: 'job="queues"', grafana_url: 'https://grafana.example.com' },
//	};
//	{ 'alerts.yaml': std.manifestYamlDoc(backstop.prometheusAlerts) }
//
// It has the four fields mixins have: _config (the fields of
// rules/config.yaml, same names, same defaults), prometheusAlerts,
// prometheusRules and grafanaDashboards. The file is generated from the
// package rules and dashboards generators (not written by hand): the rules
// are rendered once with a marker in place of each configuration value, and
// each marker becomes the jsonnet that reads $._config, so the mixin with
// the defaults is rules/*.yml and dashboards/*.json exactly (a test
// evaluates it with go-jsonnet and compares), and with another _config it is
// what `backstop rules generate --config` writes for that configuration.
//
// # Notes
//
// Numbers of _config are written with jsonnet's %g (6 significant digits,
// as the Go generator prints every value rules/config.yaml uses).
package mixin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"

	"github.com/backstop-dev/backstop/dashboards"
	"github.com/backstop-dev/backstop/rules"
)

// field is a configuration field: its yaml (and _config) name, its kind
// and the marker the rules are rendered with in its place.
type field struct {
	name   string
	kind   reflect.Kind
	marker string
}

// numberBase is the first number marker: the rules print a number field
// as it is, so its marker is a number no real setting uses.
const numberBase = 987650

// markedConfig returns a configuration whose every value is a marker, and
// the fields by marker.
func markedConfig() (rules.Config, map[string]field) {
	var c rules.Config
	v := reflect.ValueOf(&c).Elem()
	fields := map[string]field{}
	for i := 0; i < v.NumField(); i++ {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ",")
		f := field{name: name, kind: v.Field(i).Kind()}
		switch f.kind {
		case reflect.String:
			f.marker = "\x00" + name + "\x00"
			v.Field(i).SetString(f.marker)
		case reflect.Float64:
			f.marker = fmt.Sprint(numberBase + i)
			v.Field(i).SetFloat(float64(numberBase + i))
		case reflect.Int:
			f.marker = fmt.Sprint(numberBase + i)
			v.Field(i).SetInt(int64(numberBase + i))
		default:
			continue // disabled_alerts: the mixin filters the alerts itself
		}
		fields[f.marker] = f
	}
	return c, fields
}

// markers finds the markers in a rendered string: a selector ({S} or
// {S, matchers}), a string marker, or a number marker.
var markers = regexp.MustCompile(`\{(\x00(?:selector|client_selector)\x00)(?:, ([^}]*))?\}|\x00[a-z_]+\x00|\b9876[5-9]\d\b`)

// expr returns the jsonnet expression of a string rendered from the
// marked configuration.
func expr(s string, fields map[string]field) string {
	var parts []string
	last := 0
	for _, m := range markers.FindAllStringSubmatchIndex(s, -1) {
		if m[0] > last {
			parts = append(parts, literal(s[last:m[0]]))
		}
		switch {
		case m[2] >= 0: // a selector with its matchers
			matchers := ""
			if m[4] >= 0 {
				matchers = s[m[4]:m[5]]
			}
			parts = append(parts, fmt.Sprintf("sel(c.%s, %s)", fields[s[m[2]:m[3]]].name, expr(matchers, fields)))
		default:
			f, ok := fields[s[m[0]:m[1]]]
			if !ok {
				panic(fmt.Sprintf("mixin: unknown marker %q in %q", s[m[0]:m[1]], s))
			}
			switch f.kind {
			case reflect.String:
				parts = append(parts, "c."+f.name)
			case reflect.Float64:
				parts = append(parts, fmt.Sprintf("std.format('%%g', c.%s)", f.name))
			case reflect.Int:
				parts = append(parts, fmt.Sprintf("std.format('%%d', c.%s)", f.name))
			}
		}
		last = m[1]
	}
	if last < len(s) || len(parts) == 0 {
		parts = append(parts, literal(s[last:]))
	}
	return strings.Join(parts, " + ")
}

// literal is s as a jsonnet string literal (JSON's, which jsonnet reads).
func literal(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

// optional reports whether annotation k names a string field of the
// configuration: the rules add it only when that field is not empty.
func optional(k string, fields map[string]field) bool {
	f, ok := fields["\x00"+k+"\x00"]
	return ok && f.kind == reflect.String
}

// writeRule writes a rule as a jsonnet object.
func writeRule(b *bytes.Buffer, r rules.Rule, fields map[string]field) {
	b.WriteString("      {\n")
	kv := func(k, v string) { fmt.Fprintf(b, "        %s: %s,\n", k, v) }
	if r.Record != "" {
		kv("record", literal(r.Record))
	}
	if r.Alert != "" {
		kv("alert", literal(r.Alert))
	}
	kv("expr", expr(r.Expr, fields))
	if r.For != "" {
		kv("'for'", expr(r.For, fields))
	}
	for _, m := range []struct {
		name string
		m    map[string]string
	}{{"labels", r.Labels}, {"annotations", r.Annotations}} {
		if len(m.m) == 0 {
			continue
		}
		keys := make([]string, 0, len(m.m))
		for k := range m.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(b, "        %s: {\n", m.name)
		for _, k := range keys {
			key := k
			// An annotation named after a string field of the config
			// (console_url) is there only when that field is set.
			if m.name == "annotations" && optional(k, fields) {
				key = fmt.Sprintf("[if c.%s != '' then %s]", k, literal(k))
			}
			fmt.Fprintf(b, "          %s: %s,\n", key, expr(m.m[k], fields))
		}
		b.WriteString("        },\n")
	}
	b.WriteString("      },\n")
}

// Generate returns mixin.libsonnet.
func Generate() ([]byte, error) {
	marked, fields := markedConfig()
	var b bytes.Buffer
	b.WriteString(`// Generated by ` + "`go test ./mixin -update`" + ` (package mixin) from the rules and
// dashboards generators. Do not edit. backstop's rules and dashboards as a
// monitoring mixin: override _config (the fields of rules/config.yaml).
{
  _config+:: {
`)
	def := reflect.ValueOf(rules.Default())
	for i := 0; i < def.NumField(); i++ {
		name, _, _ := strings.Cut(def.Type().Field(i).Tag.Get("yaml"), ",")
		v, err := json.Marshal(def.Field(i).Interface())
		if err != nil {
			return nil, err
		}
		if string(v) == "null" {
			v = []byte("[]")
		}
		fmt.Fprintf(&b, "    %s: %s,\n", name, v)
	}
	b.WriteString(`  },

  local c = $._config,
  // A selector: the configured matchers and the rule's own, in braces
  // (none when both are empty), as package rules writes it.
  local sel(configured, own) =
    local ms = std.filter(function(m) m != '', [configured, own]);
    if ms == [] then '' else '{' + std.join(', ', ms) + '}',

  prometheusRules+:: {
    groups+: [{
      name: 'backstop.rules',
      rules: [
`)
	for _, r := range rules.Recording(marked).Groups[0].Rules {
		writeRule(&b, r, fields)
	}
	b.WriteString(`      ],
    }],
  },

  prometheusAlerts+:: {
    groups+: [{
      name: 'backstop.alerts',
      rules: std.filter(function(r) !std.member(c.disabled_alerts, r.alert), [
`)
	for _, r := range rules.Alerts(marked).Groups[0].Rules {
		writeRule(&b, r, fields)
	}
	b.WriteString(`      ]),
    }],
  },

  grafanaDashboards+:: {
`)
	all := dashboards.All()
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		j, err := dashboards.Marshal(all[n])
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "    %s: %s,\n", literal(n), strings.ReplaceAll(strings.TrimSpace(string(j)), "\n", "\n    "))
	}
	b.WriteString("  },\n}\n")
	return b.Bytes(), nil
}
