; hybrid tags query for TypeScript and TSX (conventions in python-tags.scm).

(class_declaration name: (_) @definition.class)
(abstract_class_declaration name: (_) @definition.class)
(class name: (_) @definition.class)
(interface_declaration name: (type_identifier) @definition.interface)
(type_alias_declaration name: (type_identifier) @definition.type)
(enum_declaration name: (identifier) @definition.type)
(module name: (_) @definition.module)
(function_declaration name: (identifier) @definition.function)
(function_signature name: (identifier) @definition.function)
(generator_function_declaration name: (identifier) @definition.function)
(method_definition name: (property_identifier) @definition.method)
(method_signature name: (property_identifier) @definition.method)
(abstract_method_signature name: (property_identifier) @definition.method)
(variable_declarator name: (identifier) @definition.function value: [(arrow_function) (function_expression)])
(program (lexical_declaration (variable_declarator name: (identifier) @definition.constant value: [(string) (number) (object) (array) (template_string) (call_expression) (new_expression)])))
(program (export_statement (lexical_declaration (variable_declarator name: (identifier) @definition.constant value: [(string) (number) (object) (array) (template_string) (call_expression) (new_expression)]))))

(call_expression function: (identifier) @reference.call)
(call_expression function: (member_expression property: (property_identifier) @reference.call))
(new_expression constructor: (identifier) @reference.class)
(extends_clause value: (identifier) @reference.class)
(implements_clause (type_identifier) @reference.implementation)
(type_identifier) @reference.type
(member_expression object: (identifier) @reference.name)
(arguments (identifier) @reference.name)

(import_statement source: (string (string_fragment) @reference.import))
(export_statement source: (string (string_fragment) @reference.import))
(import_specifier name: (identifier) @reference.name)

((comment) @doc (#match? @doc "^/\\*\\*"))
