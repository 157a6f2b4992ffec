package deploy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"

	"greenhouse-gateway/internal/cloud"
)

// These tests derive, from the Go source of a binary and of every package of this module it
// links, which DynamoDB actions it calls on which tables and indexes, and compare that with its
// IAM policy, both ways: a call without its permission fails, and so does a permission nothing
// calls.
//
// How the source is read: every composite literal dynamodb.XInput{...} is a call of X, with
// the table in its TableName (or the keys of BatchWriteItem's RequestItems) and the index in
// its IndexName; inside TransactWriteItems the literals types.Put, types.Update, types.Delete
// and types.ConditionCheck are authorized as dynamodb:PutItem, UpdateItem, DeleteItem and
// ConditionCheckItem (AWS: "Using IAM with DynamoDB transactions"). A table expression is
// resolved when it selects a field of cloud.Tables (tables.Readings, u.tables.Devices), or
// through the bindings below. As a cross-check, the text of every function read is grepped for
// calls of the client's methods (.PutItem(, .Query(, dynamodb.NewQueryPaginator(, ...): each
// must come with an input literal in the same function, or the test cannot tell its table.
//
// Which source is read: all of it in the binary's own packages (go list -deps), and in
// internal/cloud only the functions the binary reaches, by name, from its other packages
// (cloud.ProbeTransactionLimit, a method call .LookupHash, ...) and onwards inside the package.
// Reaching by name over-approximates: a new call that shares a name with a cloud method makes
// the test ask for that method's permissions; its message says where the name was found.

// tablePlaceholder stands for the table prefix in the policy files.
const tablePlaceholder = "${TablePrefix}"

// grant is one action on one resource: "table/NAME" or "table/NAME/index/INDEX".
type grant struct {
	Action   string
	Resource string
}

func (g grant) String() string { return g.Action + " on " + g.Resource }

// call is one DynamoDB action found in the source.
type call struct {
	grant
	Where string // file:line
	// Attrs are the attributes an UpdateItem touches (key, update and condition expressions);
	// AttrsKnown is false when the expressions are not string literals.
	Attrs      []string
	AttrsKnown bool
}

// binding resolves a table expression that is not a cloud.Tables field, in one function of
// internal/cloud ("Func" or "Recv.*"); or, with op set instead of expr, gives the tables of a
// call of op whose input is built elsewhere.
type binding struct {
	fn, expr, op string
	// Either the table is the argument argIdx of every call of callee in the binary's
	// other packages...
	callee string
	argIdx int
	// ...or one of a fixed set.
	tables func(cloud.Tables) []string
}

var bindings = []binding{
	// Keys methods use the table NewKeys was given.
	{fn: "Keys.*", expr: "k.table", callee: "NewKeys", argIdx: 1},
	{fn: "ProbeTransactionLimit", expr: "table", callee: "ProbeTransactionLimit", argIdx: 2},
	// CreateTables creates the tables of TableDefinitions (whose inputs are built there),
	// waits for each, and enables TTL where TTLAttributes says so.
	{fn: "CreateTables", op: "CreateTable", tables: func(t cloud.Tables) []string { return t.All() }},
	{fn: "CreateTables", expr: "def.TableName", tables: func(t cloud.Tables) []string { return t.All() }},
	{fn: "enableTTL", expr: "table", tables: func(t cloud.Tables) []string {
		var out []string
		for name := range cloud.TTLAttributes(t) {
			out = append(out, name)
		}
		sort.Strings(out)
		return out
	}},
}

const (
	modulePath = "greenhouse-gateway"
	cloudPkg   = modulePath + "/internal/cloud"
)

// moduleRoot is the directory with go.mod above the working directory.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.mod above the working directory")
		dir = parent
	}
}

type srcFile struct {
	path string
	file *ast.File
	src  []byte
}

type pkgSrc struct {
	path  string
	files []srcFile
}

// loadPackages parses the non-test Go files of every package of this module that binary
// (a package pattern like ./cmd/gatewayd) links.
func loadPackages(t testing.TB, fset *token.FileSet, binary string) []pkgSrc {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .GoFiles \",\"}}", binary)
	cmd.Dir = moduleRoot(t)
	out, err := cmd.Output()
	require.NoError(t, err, "go list -deps %s", binary)
	var pkgs []pkgSrc
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.Split(line, "\t")
		if len(parts) != 3 || (parts[0] != modulePath && !strings.HasPrefix(parts[0], modulePath+"/")) {
			continue
		}
		p := pkgSrc{path: parts[0]}
		for _, name := range strings.Split(parts[2], ",") {
			if name == "" {
				continue
			}
			path := filepath.Join(parts[1], name)
			src, err := os.ReadFile(path)
			require.NoError(t, err)
			f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
			require.NoError(t, err)
			p.files = append(p.files, srcFile{path: path, file: f, src: src})
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// importName returns the name under which f imports path, or "".
func importName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if p != path {
			continue
		}
		if imp.Name != nil {
			return imp.Name.Name
		}
		return p[strings.LastIndex(p, "/")+1:]
	}
	return ""
}

// funcKey names a function declaration: "Name", or "Recv.Name" for a method.
func funcKey(d *ast.FuncDecl) string {
	if d.Recv == nil || len(d.Recv.List) == 0 {
		return d.Name.Name
	}
	typ := d.Recv.List[0].Type
	if s, ok := typ.(*ast.StarExpr); ok {
		typ = s.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + d.Name.Name
	}
	return d.Name.Name
}

// clientOps returns the DynamoDB operations of the SDK client: its methods
// X(context.Context, *dynamodb.XInput, ...).
func clientOps() map[string]bool {
	ops := map[string]bool{}
	ct := reflect.TypeOf(&dynamodb.Client{})
	for i := range ct.NumMethod() {
		m := ct.Method(i)
		if m.Type.NumIn() >= 3 {
			in := m.Type.In(2)
			if in.Kind() == reflect.Pointer && in.Elem().Name() == m.Name+"Input" {
				ops[m.Name] = true
			}
		}
	}
	return ops
}

// transactItems maps the item types of TransactWriteItems and TransactGetItems to the IAM
// actions that authorize them.
var transactItems = map[string]string{
	"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem", "Get": "GetItem",
}

// waiterOps maps the SDK's waiters to the operation they poll.
var waiterOps = map[string]string{"TableExists": "DescribeTable", "TableNotExists": "DescribeTable"}

// indexConstants are the index names of the locked schema as the code spells them.
var indexConstants = map[string]string{"GSI1Index": cloud.GSI1Index, "APIKeyHashIndex": cloud.APIKeyHashIndex}

type analysis struct {
	fset    *token.FileSet
	binary  string
	names   cloud.Tables
	ops     map[string]bool
	calls   []call
	errs    []error
	argExpr map[string][][]ast.Expr // callee → argument lists of its calls, for bindings
}

var derived struct {
	sync.Mutex
	calls map[string][]call
	errs  map[string]error
}

// deriveCalls returns every DynamoDB action binary can call, with table names prefixed by
// prefix. Results are cached per binary and prefix for the test run.
func deriveCalls(t testing.TB, binary, prefix string) ([]call, error) {
	t.Helper()
	derived.Lock()
	defer derived.Unlock()
	key := binary + "\x00" + prefix
	if c, ok := derived.calls[key]; ok {
		return slices.Clone(c), derived.errs[key]
	}
	c, err := deriveCallsUncached(t, binary, prefix)
	if derived.calls == nil {
		derived.calls, derived.errs = map[string][]call{}, map[string]error{}
	}
	derived.calls[key], derived.errs[key] = c, err
	return slices.Clone(c), err
}

func deriveCallsUncached(t testing.TB, binary, prefix string) ([]call, error) {
	t.Helper()
	a := &analysis{fset: token.NewFileSet(), binary: binary, names: cloud.TableNames(prefix), ops: clientOps(),
		argExpr: map[string][][]ast.Expr{}}
	pkgs := loadPackages(t, a.fset, binary)

	// internal/cloud's functions by key, and the names they can be reached by.
	type cloudFunc struct {
		decl *ast.FuncDecl
		file srcFile
	}
	cloudFuncs := map[string][]cloudFunc{} // by bare name
	var own []pkgSrc
	for _, p := range pkgs {
		if p.path != cloudPkg {
			own = append(own, p)
			continue
		}
		for _, f := range p.files {
			for _, d := range f.file.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
					cloudFuncs[fd.Name.Name] = append(cloudFuncs[fd.Name.Name], cloudFunc{fd, f})
				}
			}
		}
	}

	// Roots: cloud.X references and method calls .X( in the binary's other packages.
	reached := map[*ast.FuncDecl]string{} // → why
	var queue []cloudFunc
	reach := func(name, why string) {
		for _, cf := range cloudFuncs[name] {
			if _, ok := reached[cf.decl]; !ok {
				reached[cf.decl] = why
				queue = append(queue, cf)
			}
		}
	}
	pkgNames := func(f *ast.File) map[string]bool {
		m := map[string]bool{}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			m[importName(f, p)] = true
		}
		return m
	}
	for _, p := range own {
		for _, f := range p.files {
			cloudName := importName(f.file, cloudPkg)
			imported := pkgNames(f.file)
			ast.Inspect(f.file, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				where := a.pos(sel)
				if x, ok := sel.X.(*ast.Ident); ok && imported[x.Name] {
					if cloudName != "" && x.Name == cloudName {
						reach(sel.Sel.Name, "cloud."+sel.Sel.Name+" at "+where)
					}
					return true
				}
				reach(sel.Sel.Name, "."+sel.Sel.Name+" at "+where) // a method, if cloud has one by that name
				return true
			})
			ast.Inspect(f.file, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
						if x, ok := sel.X.(*ast.Ident); ok && cloudName != "" && x.Name == cloudName {
							a.argExpr[sel.Sel.Name] = append(a.argExpr[sel.Sel.Name], c.Args)
						}
					}
				}
				return true
			})
		}
	}
	// Onwards inside internal/cloud.
	for len(queue) > 0 {
		cf := queue[0]
		queue = queue[1:]
		ast.Inspect(cf.decl.Body, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			switch fun := c.Fun.(type) {
			case *ast.Ident:
				reach(fun.Name, funcKey(cf.decl)+" ← "+reached[cf.decl])
			case *ast.SelectorExpr:
				reach(fun.Sel.Name, funcKey(cf.decl)+" ← "+reached[cf.decl])
			}
			return true
		})
	}

	for _, p := range own {
		for _, f := range p.files {
			for _, d := range f.file.Decls {
				a.scanDecl(d, f, "")
			}
		}
	}
	for _, fns := range cloudFuncs {
		for _, cf := range fns {
			if why, ok := reached[cf.decl]; ok {
				a.scanDecl(cf.decl, cf.file, why)
			}
		}
	}
	return a.result()
}

// result returns the calls found, sorted and without repeats (a binding resolved through
// several call sites of the same function finds the same table more than once).
func (a *analysis) result() ([]call, error) {
	sort.SliceStable(a.calls, func(i, j int) bool {
		if a.calls[i].Where != a.calls[j].Where {
			return a.calls[i].Where < a.calls[j].Where
		}
		return a.calls[i].grant.String() < a.calls[j].grant.String()
	})
	a.calls = slices.CompactFunc(a.calls, func(x, y call) bool { return x.grant == y.grant && x.Where == y.Where })
	return a.calls, errors.Join(a.errs...)
}

var methodCall = regexp.MustCompile(`\.(\w+)\(`)
var sdkHelper = regexp.MustCompile(`\bdynamodb\.New(\w+?)(Paginator|Waiter)\(`)

// scanDecl records the DynamoDB calls of one declaration. via is empty for the binary's own
// packages; for internal/cloud it says how the binary reaches the declaration.
func (a *analysis) scanDecl(d ast.Decl, f srcFile, via string) {
	inCloud := via != ""
	dyn := importName(f.file, "github.com/aws/aws-sdk-go-v2/service/dynamodb")
	typ := importName(f.file, "github.com/aws/aws-sdk-go-v2/service/dynamodb/types")
	if dyn == "" && typ == "" {
		return
	}
	fn := "(declaration)"
	if fd, ok := d.(*ast.FuncDecl); ok {
		fn = funcKey(fd)
	}
	built := map[string]bool{} // operations with an input literal in this declaration
	ast.Inspect(d, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok {
			return true
		}
		sel, ok := lit.Type.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		x, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		where := a.pos(lit)
		if inCloud {
			where += " (reached: " + via + ")"
		}
		switch {
		case dyn != "" && x.Name == dyn && strings.HasSuffix(sel.Sel.Name, "Input"):
			op := strings.TrimSuffix(sel.Sel.Name, "Input")
			if !a.ops[op] {
				return true
			}
			built[op] = true
			a.record(fn, op, lit, where, inCloud)
		case typ != "" && x.Name == typ && transactItems[sel.Sel.Name] != "":
			a.record(fn, transactItems[sel.Sel.Name], lit, where, inCloud)
		}
		return true
	})

	// The grep cross-check.
	src := f.src[a.fset.Position(d.Pos()).Offset:a.fset.Position(d.End()).Offset]
	var used []string
	for _, m := range methodCall.FindAllSubmatch(src, -1) {
		if a.ops[string(m[1])] {
			used = append(used, string(m[1]))
		}
	}
	for _, m := range sdkHelper.FindAllSubmatch(src, -1) {
		op := string(m[1])
		if string(m[2]) == "Waiter" {
			op = waiterOps[op]
		}
		used = append(used, op)
	}
	for _, op := range used {
		if op == "" {
			a.errs = append(a.errs, fmt.Errorf("%s: %s uses a waiter this test does not know", a.pos(d), fn))
			continue
		}
		if !built[op] && !a.boundOp(fn, op, d, via) {
			a.errs = append(a.errs, fmt.Errorf("%s: %s calls %s but builds no dynamodb.%sInput literal there: "+
				"the test cannot tell its table", a.pos(d), fn, op, op))
		}
	}
}

// boundOp records the calls of op in fn (an internal/cloud function, reached via via) that a
// binding describes, once, and reports whether there is such a binding.
func (a *analysis) boundOp(fn, op string, d ast.Decl, via string) bool {
	if via == "" {
		return false
	}
	for _, b := range bindings {
		if b.fn == fn && b.op == op {
			where := a.pos(d) + " (reached: " + via + ")"
			for _, table := range b.tables(a.names) {
				c := call{grant: grant{"dynamodb:" + op, "table/" + table}, Where: where}
				if !slices.ContainsFunc(a.calls, func(o call) bool { return o.grant == c.grant && o.Where == where }) {
					a.calls = append(a.calls, c)
				}
			}
			return true
		}
	}
	return false
}

func (a *analysis) pos(n ast.Node) string {
	p := a.fset.Position(n.Pos())
	return filepath.Base(filepath.Dir(p.Filename)) + "/" + filepath.Base(p.Filename) + ":" + strconv.Itoa(p.Line)
}

// record turns one input or transaction item literal into calls.
func (a *analysis) record(fn, op string, lit *ast.CompositeLit, where string, inCloud bool) {
	fields := map[string]ast.Expr{}
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok {
				fields[k.Name] = kv.Value
			}
		}
	}
	switch op {
	case "TransactWriteItems", "TransactGetItems":
		return // authorized per item: the items are literals of their own
	case "BatchWriteItem", "BatchGetItem", "BatchExecuteStatement", "ExecuteStatement", "ExecuteTransaction":
		if op != "BatchWriteItem" && op != "BatchGetItem" {
			a.errs = append(a.errs, fmt.Errorf("%s: %s: PartiQL (%s) is not understood by this test", where, fn, op))
			return
		}
		expr := unparen(fields["RequestItems"])
		// tablewrite's nonEmpty(map literal) drops the tables without items.
		if c, ok := expr.(*ast.CallExpr); ok && len(c.Args) == 1 {
			if id, ok := c.Fun.(*ast.Ident); ok && id.Name == "nonEmpty" {
				expr = unparen(c.Args[0])
			}
		}
		items, ok := expr.(*ast.CompositeLit)
		if !ok {
			a.errs = append(a.errs, fmt.Errorf("%s: %s: %s without a literal RequestItems map: the test cannot tell its tables", where, fn, op))
			return
		}
		for _, e := range items.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			for _, table := range a.tables(fn, kv.Key, where, inCloud) {
				a.calls = append(a.calls, call{grant: grant{"dynamodb:" + op, "table/" + table}, Where: where})
			}
		}
		return
	}
	tableExpr, ok := fields["TableName"]
	if !ok {
		// Operations without a table (ListTables, DescribeLimits, ...) are authorized on "*",
		// which the policies do not grant.
		a.errs = append(a.errs, fmt.Errorf("%s: %s: %s has no TableName: not allowed by a table-scoped policy", where, fn, op))
		return
	}
	index := ""
	if ix, ok := fields["IndexName"]; ok {
		index = a.index(fn, ix, where)
	}
	attrs, known := a.attributes(op, fields)
	for _, table := range a.tables(fn, tableExpr, where, inCloud) {
		res := "table/" + table
		if index != "" {
			res += "/index/" + index
		}
		c := call{grant: grant{"dynamodb:" + op, res}, Where: where}
		if op == "UpdateItem" {
			c.Attrs, c.AttrsKnown = a.withKeys(table, attrs), known
		}
		a.calls = append(a.calls, c)
	}
}

func unparen(e ast.Expr) ast.Expr {
	for {
		switch x := e.(type) {
		case *ast.ParenExpr:
			e = x.X
		case *ast.UnaryExpr:
			if x.Op != token.AND {
				return e
			}
			e = x.X
		default:
			return e
		}
	}
}

// unwrapString strips aws.String(...).
func unwrapString(e ast.Expr) ast.Expr {
	e = unparen(e)
	if c, ok := e.(*ast.CallExpr); ok && len(c.Args) == 1 {
		if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "String" {
			return unparen(c.Args[0])
		}
	}
	return e
}

func exprString(fset *token.FileSet, e ast.Expr) string {
	var b bytes.Buffer
	_ = printer.Fprint(&b, fset, e)
	return b.String()
}

// tables resolves a table expression to table names.
func (a *analysis) tables(fn string, e ast.Expr, where string, inCloud bool) []string {
	e = unwrapString(e)
	if sel, ok := e.(*ast.SelectorExpr); ok {
		if f, ok := reflect.TypeOf(a.names).FieldByName(sel.Sel.Name); ok && f.Type.Kind() == reflect.String {
			return []string{reflect.ValueOf(a.names).FieldByName(sel.Sel.Name).String()}
		}
	}
	text := exprString(a.fset, e)
	if inCloud {
		recv, _, _ := strings.Cut(fn, ".")
		for _, b := range bindings {
			if b.expr == "" || b.expr != text || (b.fn != fn && b.fn != recv+".*") {
				continue
			}
			if b.tables != nil {
				return b.tables(a.names)
			}
			var out []string
			for _, args := range a.argExpr[b.callee] {
				if b.argIdx < len(args) {
					out = append(out, a.tables("", args[b.argIdx], where, false)...)
				}
			}
			if len(a.argExpr[b.callee]) == 0 {
				a.errs = append(a.errs, fmt.Errorf("%s: %s: binding %s needs calls of cloud.%s in %s, found none",
					where, fn, text, b.callee, a.binary))
			}
			return out
		}
	}
	a.errs = append(a.errs, fmt.Errorf("%s: %s: cannot tell which table %q names "+
		"(use a cloud.Tables field, or add a binding to deploy/iam_test.go)", where, fn, text))
	return nil
}

func (a *analysis) index(fn string, e ast.Expr, where string) string {
	e = unwrapString(e)
	var name string
	switch x := e.(type) {
	case *ast.Ident:
		name = x.Name
	case *ast.SelectorExpr:
		name = x.Sel.Name
	case *ast.BasicLit:
		if s, err := strconv.Unquote(x.Value); err == nil {
			return s
		}
	}
	if v, ok := indexConstants[name]; ok {
		return v
	}
	a.errs = append(a.errs, fmt.Errorf("%s: %s: cannot tell which index %q names", where, fn, exprString(a.fset, e)))
	return "?"
}

var (
	exprIdent      = regexp.MustCompile(`[#:]?[A-Za-z_][A-Za-z0-9_]*(\s*\()?`)
	exprKeywords   = map[string]bool{"SET": true, "REMOVE": true, "ADD": true, "DELETE": true, "AND": true, "OR": true, "NOT": true, "BETWEEN": true, "IN": true}
	attributeTypes = map[string]bool{"S": true, "SS": true, "N": true, "NS": true, "B": true, "BS": true, "BOOL": true, "NULL": true, "L": true, "M": true}
)

// attributes returns the attribute names in an UpdateItem's update and condition expressions,
// and whether they could be read (string literals, no #name placeholders).
func (a *analysis) attributes(op string, fields map[string]ast.Expr) ([]string, bool) {
	if op != "UpdateItem" {
		return nil, false
	}
	var attrs []string
	for _, name := range []string{"UpdateExpression", "ConditionExpression"} {
		e, ok := fields[name]
		if !ok {
			continue
		}
		lit, ok := unwrapString(e).(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return nil, false
		}
		s, _ := strconv.Unquote(lit.Value)
		for _, tok := range exprIdent.FindAllString(s, -1) {
			switch {
			case strings.HasPrefix(tok, "#"):
				return nil, false
			case strings.HasPrefix(tok, ":"), strings.HasSuffix(tok, "("), exprKeywords[strings.ToUpper(tok)]:
			default:
				if !attributeTypes[tok] {
					attrs = append(attrs, tok)
				}
			}
		}
	}
	return attrs, true
}

// withKeys adds the key attributes of table to attrs, sorted and without duplicates.
func (a *analysis) withKeys(table string, attrs []string) []string {
	out := slices.Clone(attrs)
	for _, def := range cloud.TableDefinitions(a.names) {
		if aws.ToString(def.TableName) == table {
			for _, k := range def.KeySchema {
				out = append(out, aws.ToString(k.AttributeName))
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// policy is an IAM policy document as the project writes them.
type policy struct {
	Version   string
	Statement []statement
}

type statement struct {
	Sid       string
	Effect    string
	Action    stringList
	Resource  stringList
	Condition map[string]map[string]stringList `json:",omitempty"`
}

// stringList is a JSON string or list of strings.
type stringList []string

func (l *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = []string{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*l = many
	return nil
}

var resourceARN = regexp.MustCompile(`^arn:([^:]+):dynamodb:([^:]*):([^:]*):(table/[^/]+(/index/[^/]+)?)$`)

// decodePolicy decodes a policy strictly (unknown keys, NotAction, Principal, ... are errors).
func decodePolicy(b []byte) (policy, error) {
	var p policy
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return policy{}, err
	}
	return p, nil
}

// checkPolicy enforces the shape rules: version 2012-10-17, Allow only, named statements, no
// wildcard in any action, table or index name; and returns the granted pairs with the
// statement granting each.
func checkPolicy(p policy) (map[grant]statement, error) {
	var errs []error
	if p.Version != "2012-10-17" {
		errs = append(errs, fmt.Errorf("version %q, want 2012-10-17", p.Version))
	}
	grants := map[grant]statement{}
	sids := map[string]bool{}
	for _, s := range p.Statement {
		if s.Sid == "" || sids[s.Sid] {
			errs = append(errs, fmt.Errorf("statement %q: every statement needs its own Sid", s.Sid))
		}
		sids[s.Sid] = true
		if s.Effect != "Allow" {
			errs = append(errs, fmt.Errorf("statement %s: effect %q, want Allow", s.Sid, s.Effect))
		}
		if len(s.Action) == 0 || len(s.Resource) == 0 {
			errs = append(errs, fmt.Errorf("statement %s: no actions or no resources", s.Sid))
		}
		for _, act := range s.Action {
			if !strings.HasPrefix(act, "dynamodb:") || strings.ContainsAny(act, "*?") {
				errs = append(errs, fmt.Errorf("statement %s: action %q: want one dynamodb action, no wildcard", s.Sid, act))
			}
		}
		for _, r := range s.Resource {
			m := resourceARN.FindStringSubmatch(r)
			if m == nil || strings.ContainsAny(m[4], "*?") {
				errs = append(errs, fmt.Errorf("statement %s: resource %q: want a table or index ARN without wildcards in its names", s.Sid, r))
				continue
			}
			for _, act := range s.Action {
				g := grant{act, m[4]}
				if prev, dup := grants[g]; dup {
					errs = append(errs, fmt.Errorf("%s granted twice, by %s and %s", g, prev.Sid, s.Sid))
				}
				grants[g] = s
			}
		}
	}
	return grants, errors.Join(errs...)
}

// comparePolicy checks policy p against the calls: every call granted, every grant called, and
// each dynamodb:Attributes condition allowing exactly the attributes the calls it covers touch.
func comparePolicy(p policy, calls []call) error {
	grants, err := checkPolicy(p)
	errs := []error{err}
	called := map[grant][]call{}
	for _, c := range calls {
		called[c.grant] = append(called[c.grant], c)
	}
	for g, cs := range called {
		if _, ok := grants[g]; !ok {
			errs = append(errs, fmt.Errorf("the policy lacks %s (called at %s)", g, wheres(cs)))
		}
	}
	for g, s := range grants {
		if _, ok := called[g]; !ok {
			errs = append(errs, fmt.Errorf("statement %s grants %s, which nothing calls", s.Sid, g))
		}
	}
	// Conditions on attributes.
	type key struct{ sid, op string }
	touched := map[string][]string{}
	for g, s := range grants {
		for op, conds := range s.Condition {
			for k, allowed := range conds {
				if k != "dynamodb:Attributes" || op != "ForAllValues:StringEquals" {
					errs = append(errs, fmt.Errorf("statement %s: condition %s %s is not understood by this test", s.Sid, op, k))
					continue
				}
				for _, c := range called[g] {
					if !c.AttrsKnown {
						errs = append(errs, fmt.Errorf("statement %s allows only attributes %v, but the test cannot read the attributes %s touches at %s",
							s.Sid, allowed, g.Action, c.Where))
						continue
					}
					for _, attr := range c.Attrs {
						if !slices.Contains(allowed, attr) {
							errs = append(errs, fmt.Errorf("statement %s does not allow attribute %s, which %s at %s touches",
								s.Sid, attr, g.Action, c.Where))
						}
					}
					touched[s.Sid] = append(touched[s.Sid], c.Attrs...)
				}
			}
		}
	}
	for _, s := range p.Statement {
		allowed, ok := s.Condition["ForAllValues:StringEquals"]["dynamodb:Attributes"]
		if !ok {
			continue
		}
		for _, attr := range allowed {
			if !slices.Contains(touched[s.Sid], attr) {
				errs = append(errs, fmt.Errorf("statement %s allows attribute %s, which no call touches", s.Sid, attr))
			}
		}
	}
	return errors.Join(errs...)
}

func wheres(cs []call) string {
	var w []string
	for _, c := range cs {
		w = append(w, c.Where)
	}
	sort.Strings(w)
	return strings.Join(slices.Compact(w), ", ")
}

func loadPolicy(t testing.TB, path string) policy {
	t.Helper()
	p, err := decodePolicy(readFile(t, path))
	require.NoError(t, err, path)
	return p
}

func actionsOf(calls []call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Action)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func policyActions(p policy) []string {
	var out []string
	for _, s := range p.Statement {
		out = append(out, s.Action...)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func TestGatewayPolicyIsExactlyWhatGatewaydCalls(t *testing.T) {
	calls, err := deriveCalls(t, "./cmd/gatewayd", tablePlaceholder)
	require.NoError(t, err)
	for _, c := range calls {
		t.Logf("gatewayd calls %s at %s", c.grant, c.Where)
	}
	p := loadPolicy(t, "iam/gateway-policy.json")
	require.Equal(t, actionsOf(calls), policyActions(p), "the gateway policy's actions are exactly those gatewayd calls")
	require.NoError(t, comparePolicy(p, calls))

	// api_keys: a gateway writes only the attributes it names (key use, rehash, the device keys
	// it issues and revokes) and can neither read keys other than by their hash nor delete
	// them. Enrollment needs is_active: IAM cannot tell a revocation from an activation, so a
	// gateway's credentials can create active keys (docs/security.md says so).
	for _, s := range p.Statement {
		for _, r := range s.Resource {
			if !strings.HasSuffix(r, "table/"+tablePlaceholder+cloud.APIKeysTable) {
				continue
			}
			for _, act := range []string{"dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:Scan", "dynamodb:Query"} {
				require.NotContains(t, s.Action, act, "statement %s", s.Sid)
			}
			if slices.Contains(s.Action, "dynamodb:UpdateItem") {
				allowed := s.Condition["ForAllValues:StringEquals"]["dynamodb:Attributes"]
				require.NotEmpty(t, allowed, "UpdateItem on api_keys must be limited to the attributes the gateway writes")
			}
		}
	}
}

func TestAdminPolicyIsExactlyWhatGatewayctlCalls(t *testing.T) {
	calls, err := deriveCalls(t, "./cmd/gatewayctl", tablePlaceholder)
	require.NoError(t, err)
	for _, c := range calls {
		t.Logf("gatewayctl calls %s at %s", c.grant, c.Where)
	}
	p := loadPolicy(t, "iam/admin-policy.json")
	require.Equal(t, actionsOf(calls), policyActions(p))
	require.NoError(t, comparePolicy(p, calls))
}

// TestPolicyCheckCatchesDrift proves the comparison fails on a missing call, a permission
// nothing calls, a wildcard, and a condition that forbids what the gateway writes.
func TestPolicyCheckCatchesDrift(t *testing.T) {
	calls, err := deriveCalls(t, "./cmd/gatewayd", tablePlaceholder)
	require.NoError(t, err)
	src := readFile(t, "iam/gateway-policy.json")
	table := func(name string) string { return "arn:aws:dynamodb:*:*:table/" + tablePlaceholder + name }
	tests := []struct {
		name   string
		mutate func(p *policy)
		calls  []call
		want   string
	}{
		{"a new call without permission", nil,
			append(slices.Clone(calls), call{grant: grant{"dynamodb:GetItem", "table/" + tablePlaceholder + "devices"}, Where: "new.go:1"}),
			"the policy lacks dynamodb:GetItem on table/${TablePrefix}devices (called at new.go:1)"},
		{"a permission nothing calls", func(p *policy) {
			p.Statement[0].Action = append(p.Statement[0].Action, "dynamodb:DeleteItem")
		}, calls, "grants dynamodb:DeleteItem on table/${TablePrefix}device_readings, which nothing calls"},
		{"a wildcard action", func(p *policy) {
			p.Statement[0].Action = append(p.Statement[0].Action, "dynamodb:*")
		}, calls, `action "dynamodb:*"`},
		{"a wildcard table", func(p *policy) {
			p.Statement[2].Resource = stringList{table("*")}
		}, calls, "without wildcards"},
		{"a wildcard index", func(p *policy) {
			p.Statement[3].Resource = stringList{table(cloud.APIKeysTable) + "/index/*"}
		}, calls, "without wildcards"},
		{"an index granted as its table", func(p *policy) {
			p.Statement[3].Resource = stringList{table(cloud.APIKeysTable)}
		}, calls, "the policy lacks dynamodb:Query on table/${TablePrefix}api_keys/index/api_key_hash_index"},
		{"a condition without last_used_at", func(p *policy) {
			p.Statement[4].Condition["ForAllValues:StringEquals"]["dynamodb:Attributes"] = stringList{"key_id", "api_key_hash"}
		}, calls, "does not allow attribute last_used_at"},
		{"a condition allowing an attribute nothing writes", func(p *policy) {
			c := p.Statement[4].Condition["ForAllValues:StringEquals"]
			c["dynamodb:Attributes"] = append(slices.Clone(c["dynamodb:Attributes"]), "friendly_name")
		}, calls, "allows attribute friendly_name, which no call touches"},
		{"a deny statement", func(p *policy) { p.Statement[0].Effect = "Deny" }, calls, `effect "Deny"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := decodePolicy(src) // a fresh copy each time
			require.NoError(t, err)
			if tc.mutate != nil {
				tc.mutate(&p)
			}
			err = comparePolicy(p, tc.calls)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = decodePolicy([]byte(`{"Version":"2012-10-17","Statement":[{"Sid":"x","Effect":"Allow","NotAction":"dynamodb:DeleteTable","Resource":"*"}]}`))
	require.ErrorContains(t, err, "NotAction", "NotAction and other keys are refused")
}

// TestSourceScanFindsNewCalls proves the source side: a new call is found with its table, and
// a call the test cannot resolve is an error rather than silently ignored.
func TestSourceScanFindsNewCalls(t *testing.T) {
	const header = `package uplink

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

`
	tests := []struct {
		name  string
		body  string
		want  []string // grants found
		error string
	}{
		{"a GetItem", `func (u *Uplink) get() {
	u.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(u.tables.Devices)})
}`, []string{"dynamodb:GetItem on table/p_devices"}, ""},
		{"an update inside a transaction", `func (u *Uplink) tx() {
	items := []types.TransactWriteItem{{Update: &types.Update{TableName: aws.String(u.tables.APIKeys),
		UpdateExpression: aws.String("SET is_active = :t"), ConditionExpression: aws.String("attribute_exists(key_id)")}}}
	u.db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
}`, []string{"dynamodb:UpdateItem on table/p_api_keys"}, ""},
		{"a query on an index", `func (u *Uplink) q() {
	u.db.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(u.tables.Devices), IndexName: aws.String(cloud.GSI1Index)})
}`, []string{"dynamodb:Query on table/p_devices/index/gsi1"}, ""},
		{"a batch write", `func (u *Uplink) bw() {
	u.db.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{u.tables.ProcessedBatches: reqs}})
}`, []string{"dynamodb:BatchWriteItem on table/p_processed_batches"}, ""},
		{"an input built elsewhere", `func (u *Uplink) del(in *dynamodb.DeleteItemInput) {
	u.db.DeleteItem(ctx, in)
}`, nil, "calls DeleteItem but builds no dynamodb.DeleteItemInput literal there"},
		{"a table the test cannot resolve", `func (u *Uplink) put(name string) {
	u.db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(name)})
}`, nil, `cannot tell which table "name" names`},
		{"an operation without a table", `func (u *Uplink) list() {
	u.db.ListTables(ctx, &dynamodb.ListTablesInput{})
}`, nil, "ListTables has no TableName"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &analysis{fset: token.NewFileSet(), binary: "test", names: cloud.TableNames("p_"), ops: clientOps(),
				argExpr: map[string][][]ast.Expr{}}
			src := []byte(header + tc.body)
			f, err := parser.ParseFile(a.fset, "uplink/new.go", src, parser.SkipObjectResolution)
			require.NoError(t, err)
			for _, d := range f.Decls {
				a.scanDecl(d, srcFile{path: "uplink/new.go", file: f, src: src}, "")
			}
			calls, err := a.result()
			if tc.error != "" {
				require.ErrorContains(t, err, tc.error)
				return
			}
			require.NoError(t, err)
			var got []string
			for _, c := range calls {
				got = append(got, c.grant.String())
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestTemplatePoliciesMatchTheJSONFiles checks that the managed policies in the CloudFormation
// template grant what deploy/iam/*.json grant, statement by statement; ARNs are compared
// without region and account (the files say *, the template its own).
func TestTemplatePoliciesMatchTheJSONFiles(t *testing.T) {
	tmpl, err := parseTemplate(readFile(t, templatePath), map[string]any{"TablePrefix": tablePlaceholder})
	require.NoError(t, err)
	for id, file := range map[string]string{"GatewayPolicy": "iam/gateway-policy.json", "AdminPolicy": "iam/admin-policy.json"} {
		t.Run(id, func(t *testing.T) {
			require.Equal(t, "AWS::IAM::ManagedPolicy", tmpl.Resources[id]["Type"])
			props, err := tmpl.properties(id)
			require.NoError(t, err)
			doc, err := json.Marshal(props["PolicyDocument"])
			require.NoError(t, err)
			fromTemplate, err := decodePolicy(doc)
			require.NoError(t, err)
			require.Equal(t, normalizePolicy(loadPolicy(t, file)), normalizePolicy(fromTemplate))
		})
	}
}

var arnRegionAccount = regexp.MustCompile(`^(arn:[^:]+:dynamodb):[^:]*:[^:]*:`)

func normalizePolicy(p policy) policy {
	for i, s := range p.Statement {
		s.Action = slices.Sorted(slices.Values(s.Action))
		res := make(stringList, len(s.Resource))
		for j, r := range s.Resource {
			res[j] = arnRegionAccount.ReplaceAllString(r, "$1:*:*:")
		}
		s.Resource = slices.Sorted(slices.Values(res))
		p.Statement[i] = s
	}
	return p
}
