; hybrid tags query for JavaScript / JSX (conventions in python-tags.scm).

(class_declaration name: (_) @definition.class)
(class name: (_) @definition.class)
(function_declaration name: (identifier) @definition.function)
(generator_function_declaration name: (identifier) @definition.function)
(method_definition name: (property_identifier) @definition.method)
(variable_declarator name: (identifier) @definition.function value: [(arrow_function) (function_expression)])
(program (lexical_declaration (variable_declarator name: (identifier) @definition.constant value: [(string) (number) (object) (array) (template_string) (call_expression) (new_expression)])))
(assignment_expression left: (member_expression property: (property_identifier) @definition.function) right: [(arrow_function) (function_expression)])
(pair key: (property_identifier) @definition.function value: [(arrow_function) (function_expression)])

(call_expression function: (identifier) @reference.call)
(call_expression function: (member_expression property: (property_identifier) @reference.call))
(new_expression constructor: (identifier) @reference.class)
(class_heritage (identifier) @reference.class)
(jsx_opening_element name: (identifier) @reference.class)
(jsx_self_closing_element name: (identifier) @reference.class)
(member_expression object: (identifier) @reference.name)
(arguments (identifier) @reference.name)

(import_statement source: (string (string_fragment) @reference.import))
(export_statement source: (string (string_fragment) @reference.import))
(import_specifier name: (identifier) @reference.name)
((call_expression function: (identifier) @_require arguments: (arguments (string (string_fragment) @reference.import)))
  (#eq? @_require "require"))

((comment) @doc (#match? @doc "^/\\*\\*"))
