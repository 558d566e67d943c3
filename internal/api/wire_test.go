package api

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/internal/files"
	"github.com/sandkeep/sandkeep/internal/store"
	"github.com/sandkeep/sandkeep/wire"
)

// wireTypes are the Go types of openapi.json's schemas, by schema name: package wire's (which the server
// decodes and encodes here and the client sends and decodes), and the store's and the workspace's rows the
// server encodes as they are (the client aliases those).
var wireTypes = map[string]reflect.Type{
	"Error": reflect.TypeFor[wire.Error](), "ExecRequest": reflect.TypeFor[wire.ExecRequest](),
	"ExecResult": reflect.TypeFor[wire.ExecResult](), "Sandbox": reflect.TypeFor[wire.Sandbox](),
	"SandboxList": reflect.TypeFor[wire.SandboxList](), "FileWritten": reflect.TypeFor[wire.FileWritten](),
	"TarSummary": reflect.TypeFor[files.TarSummary](), "Entry": reflect.TypeFor[files.Entry](),
	"FileList": reflect.TypeFor[FileList](), "Run": reflect.TypeFor[store.Run](), "RunList": reflect.TypeFor[RunList](),
	"Event": reflect.TypeFor[store.Event](), "EventList": reflect.TypeFor[EventList](),
	"RunLog": reflect.TypeFor[store.RunLog](), "RunLogList": reflect.TypeFor[RunLogList](),
	"RunStart": reflect.TypeFor[wire.RunStart](), "RunAdmitted": reflect.TypeFor[wire.RunAdmitted](),
	"RunFinish": reflect.TypeFor[wire.RunFinish](), "TemplateList": reflect.TypeFor[wire.TemplateList](),
	"TTYStart": reflect.TypeFor[wire.TTYStart](), "WindowSize": reflect.TypeFor[wire.WindowSize](),
	"TTYControl": reflect.TypeFor[wire.TTYControl](), "TTYFinal": reflect.TypeFor[wire.TTYFinal](),
	"ForwardPortList": reflect.TypeFor[wire.ForwardPortList](), "ForwardPort": reflect.TypeFor[wire.ForwardPort](),
	"ForkRequest": reflect.TypeFor[wire.ForkRequest](), "ProcessStart": reflect.TypeFor[wire.ProcessStart](),
	"Process": reflect.TypeFor[wire.Process](), "ProcessList": reflect.TypeFor[wire.ProcessList](),
	"ProcessInput": reflect.TypeFor[wire.ProcessInput](), "ProcessSignal": reflect.TypeFor[wire.ProcessSignal](),
	"SnapshotCreate": reflect.TypeFor[wire.SnapshotCreate](), "SnapshotRestore": reflect.TypeFor[wire.SnapshotRestore](),
	"Snapshot": reflect.TypeFor[wire.Snapshot](), "SnapshotList": reflect.TypeFor[wire.SnapshotList](),
}

// schema is the part of a JSON Schema the comparison reads.
type schema struct {
	Type       any                `json:"type"` // a name, or a list of names
	Ref        string             `json:"$ref"`
	Properties map[string]*schema `json:"properties"`
	Required   []string           `json:"required"`
	Items      *schema            `json:"items"`
	AllOf      []*schema          `json:"allOf"`
	OneOf      []*schema          `json:"oneOf"`
}

// TestWireAgreesWithOpenAPI: every schema of openapi.json has its Go type, and each type has exactly the
// schema's properties (names as JSON writes them, embedded structs flattened), each of a matching JSON type,
// a $ref naming the type the field holds. A field added to a body and not to the document (or the reverse)
// fails here, not in a caller's generated client.
func TestWireAgreesWithOpenAPI(t *testing.T) {
	raw, err := os.ReadFile("openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Components struct {
			Schemas map[string]*schema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	schemas := doc.Components.Schemas
	for name, s := range schemas {
		if len(s.OneOf) > 0 {
			continue // StreamMessage: one NDJSON line, a chunk or the final result or error (TestExecStream*)
		}
		typ, ok := wireTypes[name]
		if !ok {
			t.Errorf("schema %s has no Go type in wireTypes", name)
			continue
		}
		compareObject(t, name, schemas, s, typ)
	}
	for name := range wireTypes {
		if schemas[name] == nil {
			t.Errorf("wireTypes names %s, which openapi.json does not describe", name)
		}
	}
}

// compareObject holds the struct typ to the object schema s (resolving allOf), at path.
func compareObject(t *testing.T, path string, schemas map[string]*schema, s *schema, typ reflect.Type) {
	t.Helper()
	props := map[string]*schema{}
	var required []string
	for _, part := range append([]*schema{s}, s.AllOf...) {
		if part.Ref != "" {
			part = schemas[strings.TrimPrefix(part.Ref, "#/components/schemas/")]
		}
		for k, v := range part.Properties {
			props[k] = v
		}
		required = append(required, part.Required...)
	}
	fields := map[string]reflect.Type{}
	collectFields(typ, fields)
	for name, ft := range fields {
		p, ok := props[name]
		if !ok {
			t.Errorf("%s: %s has field %q, which the schema does not describe", path, typ, name)
			continue
		}
		compareValue(t, path+"."+name, schemas, p, ft)
	}
	for name := range props {
		if _, ok := fields[name]; !ok {
			t.Errorf("%s: the schema describes %q, which %s does not have", path, name, typ)
		}
	}
	for _, name := range required {
		if _, ok := fields[name]; !ok {
			t.Errorf("%s: the schema requires %q, which %s does not have", path, name, typ)
		}
	}
}

// collectFields gathers typ's JSON fields: by tag name, embedded untagged structs flattened, "-" left out.
func collectFields(typ reflect.Type, out map[string]reflect.Type) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		switch {
		case name == "-" || !f.IsExported():
			continue
		case f.Anonymous && name == "":
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			collectFields(ft, out)
			continue
		case name == "":
			name = f.Name
		}
		out[name] = f.Type
	}
}

var timeType = reflect.TypeFor[time.Time]()

// compareValue holds the Go type ft to the schema p.
func compareValue(t *testing.T, path string, schemas map[string]*schema, p *schema, ft reflect.Type) {
	t.Helper()
	for ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	if p.Ref != "" {
		name := strings.TrimPrefix(p.Ref, "#/components/schemas/")
		if want := wireTypes[name]; want != ft {
			t.Errorf("%s: the schema refers to %s (%v), the field is %v", path, name, want, ft)
		}
		return
	}
	var types []string
	switch v := p.Type.(type) {
	case string:
		types = []string{v}
	case []any:
		for _, x := range v {
			types = append(types, x.(string))
		}
	}
	want := jsonTypeOf(ft)
	if want == "" || len(types) == 0 {
		return // any JSON value (a payload), or a schema that does not say
	}
	if !slices.Contains(types, want) && !(want == "integer" && slices.Contains(types, "number")) {
		t.Errorf("%s: the schema says %v, the field is %v (%s)", path, types, ft, want)
		return
	}
	switch {
	case want == "array" && p.Items != nil:
		compareValue(t, path+"[]", schemas, p.Items, ft.Elem())
	case want == "object" && ft.Kind() == reflect.Struct && p.Properties != nil:
		compareObject(t, path, schemas, p, ft)
	}
}

// jsonTypeOf is the JSON type encoding/json writes for ft ("" for any value).
func jsonTypeOf(ft reflect.Type) string {
	if ft == timeType {
		return "string"
	}
	switch ft.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		if ft.Elem().Kind() == reflect.Uint8 {
			if ft.Name() == "RawMessage" {
				return ""
			}
			return "string"
		}
		return "array"
	case reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return ""
}
