package render

import (
	"reflect"
	"strings"
	"testing"
)

func TestDecodeDocuments(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want []interface{}
		err  string
	}{
		{
			name: "YAML 1.2 scalars become JSON types",
			in:   "i: 3\nf: 1.5\nb: true\nn: null\ns: \"3\"\non: on\nv: 1.20\nbig: 99999999999999999999\nts: 2024-01-01\n",
			want: []interface{}{map[string]interface{}{
				"i": int64(3), "f": 1.5, "b": true, "n": nil, "s": "3", "on": "on", "v": 1.2, "big": 1e20, "ts": "2024-01-01",
			}},
		},
		{
			name: "empty documents keep their index",
			in:   "a: 1\n---\n# only a comment\n---\nb: 2\n",
			want: []interface{}{map[string]interface{}{"a": int64(1)}, nil, map[string]interface{}{"b": int64(2)}},
		},
		{
			name: "anchors and merge keys, explicit keys win",
			in:   "base: &b {x: 1, y: 2}\nother:\n  <<: *b\n  y: 3\n",
			want: []interface{}{map[string]interface{}{
				"base":  map[string]interface{}{"x": int64(1), "y": int64(2)},
				"other": map[string]interface{}{"x": int64(1), "y": int64(3)},
			}},
		},
		{name: "duplicate keys", in: "a: 1\na: 2\n", err: `line 2: mapping key "a" already defined`},
		{name: "infinity has no JSON form", in: "a: .inf\n", err: "cannot be represented in JSON"},
		{name: "alias bomb", in: "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\n", err: "too many nodes"},
		{name: "deep nesting", in: strings.Repeat("[", 20000), err: "exceeded max depth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := decodeDocuments([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []interface{}
			for i, d := range docs {
				if d.Index != i+1 {
					t.Errorf("document %d has index %d", i+1, d.Index)
				}
				got = append(got, d.Value)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v\nwant %#v", got, tc.want)
			}
		})
	}
}
