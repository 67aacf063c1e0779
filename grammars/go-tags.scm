; hybrid tags query for Go (conventions in python-tags.scm).

(function_declaration name: (identifier) @definition.function)
(method_declaration name: (field_identifier) @definition.method)
(type_spec name: (type_identifier) @definition.type)
(source_file (const_declaration (const_spec name: (identifier) @definition.constant)))
(source_file (var_declaration (var_spec name: (identifier) @definition.constant)))
(method_elem name: (field_identifier) @definition.method)

(call_expression function: (identifier) @reference.call)
(call_expression function: (selector_expression field: (field_identifier) @reference.call))
(type_identifier) @reference.type
(qualified_type name: (type_identifier) @reference.type)
(composite_literal type: (type_identifier) @reference.class)
(selector_expression field: (field_identifier) @reference.name)

(import_spec path: (interpreted_string_literal) @reference.import)

(source_file (comment) @doc)
