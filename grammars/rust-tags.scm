; hybrid tags query for Rust (conventions in python-tags.scm).

(struct_item name: (type_identifier) @definition.class)
(enum_item name: (type_identifier) @definition.class)
(union_item name: (type_identifier) @definition.class)
(type_item name: (type_identifier) @definition.type)
(declaration_list (function_item name: (identifier) @definition.method))
(source_file (function_item name: (identifier) @definition.function))
(mod_item (declaration_list (function_item name: (identifier) @definition.function)))
(function_signature_item name: (identifier) @definition.method)
(trait_item name: (type_identifier) @definition.interface)
(mod_item name: (identifier) @definition.module)
(macro_definition name: (identifier) @definition.macro)
(const_item name: (identifier) @definition.constant)
(static_item name: (identifier) @definition.constant)

(call_expression function: (identifier) @reference.call)
(call_expression function: (field_expression field: (field_identifier) @reference.call))
(call_expression function: (scoped_identifier name: (identifier) @reference.call))
(macro_invocation macro: (identifier) @reference.call)
(impl_item trait: (type_identifier) @reference.implementation)
(impl_item type: (type_identifier) @reference.implementation)
(type_identifier) @reference.type
(struct_expression name: (type_identifier) @reference.class)

(use_declaration argument: (_) @reference.import)
(mod_item name: (identifier) @reference.import !body)

(line_comment (doc_comment) @doc)
